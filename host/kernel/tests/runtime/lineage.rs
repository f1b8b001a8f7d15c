//! Fan-out and fan-in by lineage: iteration tokens, nested collects, sticky side inputs.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_and_in_pairs_items_by_lineage_when_branches_finish_out_of_order() {
    // item → delay (early items slowest) → add.a ; index → add.b ; add → collect.
    let doc = graph(
        &[
            (
                "list",
                "heddle.constant",
                json!({"value": [0, 1, 2, 3, 4, 5, 6, 7]}),
            ),
            ("each", "heddle.foreach", json!({})),
            ("slow", "test.delay", json!({"n": 8, "step_ms": 3})),
            ("add", "test.add", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "slow", "value"),
            ("slow", "value", "add", "a"),
            ("each", "index", "add", "b"),
            ("add", "sum", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"].len(), 1);
    assert_eq!(ilist(&r.outputs["out"][0]), vec![0, 2, 4, 6, 8, 10, 12, 14]);
    assert_eq!(r.nodes["add"].invocations, 8);
    assert_eq!(r.nodes["gather"].invocations, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_iteration_mints_one_token_per_item_group() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": [5, 6, 7]})),
            ("each", "test.stream_each", json!({})),
            ("add", "test.add", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "add", "a"),
            ("each", "index", "add", "b"),
            ("add", "sum", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(ilist(&r.outputs["out"][0]), vec![5, 7, 9]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_iteration_collects_per_parent_including_empty_lists() {
    let doc = graph(
        &[
            (
                "lists",
                "heddle.constant",
                json!({"value": [[1, 2], [3], [], [4, 5, 6]]}),
            ),
            ("outer", "heddle.foreach", json!({})),
            ("inner", "heddle.foreach", json!({})),
            ("p", "heddle.passthrough", json!({})),
            ("c_inner", "heddle.collect", json!({})),
            ("c_outer", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("lists", "value", "outer", "list"),
            ("outer", "item", "inner", "list"),
            ("inner", "item", "p", "value"),
            ("p", "value", "c_inner", "item"),
            ("c_inner", "list", "c_outer", "item"),
            ("c_outer", "list", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let got: Vec<Vec<i64>> = r.outputs["out"][0]
        .as_list()
        .unwrap()
        .iter()
        .map(ilist)
        .collect();
    assert_eq!(got, vec![vec![1, 2], vec![3], vec![], vec![4, 5, 6]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_over_an_empty_list_emits_an_empty_list() {
    let doc = graph(
        &[
            ("list", "heddle.constant", json!({"value": []})),
            ("each", "heddle.foreach", json!({})),
            ("p", "heddle.passthrough", json!({})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("list", "value", "each", "list"),
            ("each", "item", "p", "value"),
            ("p", "value", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    assert_eq!(r.outputs["out"], vec![Value::list(vec![])]);
    assert_eq!(outcome(&r, "p"), skipped(SkipReason::NoInput));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_side_inputs_pair_with_every_item() {
    // Empty-scope side input (k) and prefix-scope side input (outer index) under a
    // nested iteration.
    let doc = graph(
        &[
            ("lists", "heddle.constant", json!({"value": [[1, 2], [3]]})),
            ("k", "heddle.constant", json!({"value": 10})),
            ("outer", "heddle.foreach", json!({})),
            ("inner", "heddle.foreach", json!({})),
            ("plus_k", "test.add", json!({})),
            ("plus_outer", "test.add", json!({})),
            ("c_inner", "heddle.collect", json!({})),
            ("c_outer", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({})),
        ],
        &[
            ("lists", "value", "outer", "list"),
            ("outer", "item", "inner", "list"),
            ("inner", "item", "plus_k", "a"),
            ("k", "value", "plus_k", "b"),
            ("plus_k", "sum", "plus_outer", "a"),
            ("outer", "index", "plus_outer", "b"),
            ("plus_outer", "sum", "c_inner", "item"),
            ("c_inner", "list", "c_outer", "item"),
            ("c_outer", "list", "out", "value"),
        ],
    );
    let r = run(&doc, RunOptions::default()).await;
    assert_eq!(r.status, RunStatus::Completed, "{:?}", r.error);
    let got: Vec<Vec<i64>> = r.outputs["out"][0]
        .as_list()
        .unwrap()
        .iter()
        .map(ilist)
        .collect();
    assert_eq!(got, vec![vec![11, 12], vec![14]]);
}
