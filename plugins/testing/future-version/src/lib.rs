//! Exports `heddle:node/node@0.9.0`, a version the host does not support.

wit_bindgen::generate!({
    inline: "
        package heddle:node@0.9.0;
        interface node {
            describe: func() -> list<string>;
        }
        world old-node { export node; }
    ",
    world: "old-node",
});

struct Future;

impl exports::heddle::node::node::Guest for Future {
    fn describe() -> Vec<String> {
        vec!["future.node".into()]
    }
}

export!(Future);
