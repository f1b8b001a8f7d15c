//! A component of some other world: it does not export `heddle:node/node`.

wit_bindgen::generate!({
    inline: "
        package other:thing@1.0.0;
        world thing { export run: func() -> string; }
    ",
    world: "thing",
});

struct Thing;

impl Guest for Thing {
    fn run() -> String {
        "not a node package".into()
    }
}

export!(Thing);
