use super::*;

fn obj(json: &str) -> Value {
    Value::from_json(serde_json::from_str(json).unwrap())
}

/// The engine alone, bypassing the fast path.
fn engine_test(e: &Expr, scope: &Value) -> Result<bool, ExprError> {
    let slow = Expr {
        simple: None,
        ..e.clone()
    };
    slow.test(scope)
}

#[test]
fn fast_path_agrees_with_the_engine() {
    let exprs = [
        "value > 0",
        "value >= 0",
        "value < 2.5",
        "value <= 1e1",
        "value = 3",
        "value != 3",
        "value = \"ok\"",
        "value > 'b'",
        "value = true",
        "value = null",
        "fields.score > 0.5",
        "fields.a.b = 1",
        "value.missing > 0",
    ];
    let scopes = [
        r#"{"value": 3}"#,
        r#"{"value": -1}"#,
        r#"{"value": 2.5}"#,
        r#"{"value": 10}"#,
        r#"{"value": "ok"}"#,
        r#"{"value": "c"}"#,
        r#"{"value": true}"#,
        r#"{"value": null}"#,
        r#"{"value": {"x": 1}}"#,
        r#"{"fields": {"score": 0.7, "a": {"b": 1}}}"#,
        r#"{"fields": {"score": "high"}}"#,
        r#"{}"#,
    ];
    let mut fast_used = 0;
    for text in exprs {
        let e = Expr::compile(text).unwrap();
        assert!(e.simple.is_some(), "{text} takes the fast path");
        for s in scopes {
            let scope = obj(s);
            let fast = e.test(&scope);
            let slow = engine_test(&e, &scope);
            fast_used += 1;
            match (&fast, &slow) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{text} over {s}"),
                (Err(_), Err(_)) => {}
                _ => panic!("{text} over {s}: fast {fast:?}, engine {slow:?}"),
            }
        }
    }
    assert_eq!(fast_used, exprs.len() * scopes.len());
}

#[test]
fn shapes_the_fast_path_leaves_to_the_engine() {
    for text in [
        "value > 0 and value < 3",
        "$count(value) > 1",
        "value > -1",
        "value = \"a\\\"b\"",
        "true",
        "in > 1",
    ] {
        let e = Expr::compile(text).unwrap();
        assert!(e.simple.is_none(), "{text}");
    }
    // A list on the path: JSONata's sequence rules decide, so the engine does.
    let e = Expr::compile("value.n > 1").unwrap();
    let scope = obj(r#"{"value": [{"n": 0}, {"n": 5}]}"#);
    assert_eq!(e.test(&scope), engine_test(&e, &scope));
}

#[test]
fn syntax_errors_and_unsupported_functions_are_refused_at_compile() {
    let err = Expr::compile("value >").unwrap_err();
    assert!(matches!(err, ExprError::Syntax { .. }), "{err}");
    assert!(err.to_string().contains("`value >`"), "{err}");
    let err = Expr::compile("$now() > '2020'").unwrap_err();
    assert_eq!(
        err.to_string(),
        "JSONata expression `$now() > '2020'` uses the function $now(), which this build does not support"
    );
    // A function JSONata does not have would fail every evaluation: refused too, while
    // one the expression defines itself, a variable and text in a string are fine.
    let err = Expr::compile("$lenght(value) > 1").unwrap_err();
    assert_eq!(
        err.to_string(),
        "JSONata expression `$lenght(value) > 1` uses the unknown function $lenght()"
    );
    assert!(Expr::compile("($f := function($x) { $x > 1 }; $f(value))").is_ok());
    assert!(Expr::compile("value = '$now()' and $nowish = 1").is_ok());
    assert!(Expr::compile("$length(value) > 1 and $lowercase(value) = 'a'").is_ok());
    // The newer operators parse and evaluate.
    let scope = obj(r#"{"value": {"n": 3}}"#);
    for text in [
        "(value.missing ?? 3) = 3",
        "(value.missing ?: 'x') = 'x'",
        "value.n % 2 = 1",
    ] {
        assert_eq!(
            Expr::compile(text).unwrap().test(&scope),
            Ok(true),
            "{text}"
        );
    }
}

#[test]
fn a_condition_yields_a_boolean_or_fails_loudly() {
    let scope = obj(r#"{"value": {"n": 2}}"#);
    assert_eq!(
        Expr::compile("value.n * 2 = 4").unwrap().test(&scope),
        Ok(true)
    );
    assert_eq!(
        Expr::compile("value.absent").unwrap().test(&scope),
        Ok(false)
    );
    let err = Expr::compile("value.n + 1")
        .unwrap()
        .test(&scope)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "JSONata expression `value.n + 1` must yield true or false, got a number"
    );
    let err = Expr::compile("value.n > 'a'")
        .unwrap()
        .test(&scope)
        .unwrap_err();
    assert!(matches!(err, ExprError::Eval { .. }), "{err}");
    let err = Expr::compile("$error('boom')")
        .unwrap()
        .test(&scope)
        .unwrap_err();
    assert!(err.to_string().contains("boom"), "{err}");
}

#[test]
fn reads_lists_the_paths_taken_from_the_scope_and_no_others() {
    let reads = |text: &str| Expr::compile(text).unwrap().reads();
    let paths = |ps: &[&[&str]]| -> Vec<Vec<String>> {
        ps.iter()
            .map(|p| p.iter().map(|s| s.to_string()).collect())
            .collect()
    };
    assert_eq!(
        reads("fields.amount > 100"),
        paths(&[&["fields", "amount"]])
    );
    assert_eq!(
        reads("$exists(fields.x) ? fields.y : value"),
        paths(&[&["fields", "x"], &["fields", "y"], &["value"]])
    );
    assert_eq!(
        reads("$count(upstream.all.output) = 3 and upstream.`my node`.fields.ok"),
        paths(&[
            &["upstream", "all", "output"],
            &["upstream", "my node", "fields", "ok"]
        ])
    );
    // A predicate's paths are read from what the path selected, not from the scope; a
    // lambda's body from what it is called with.
    assert_eq!(
        reads("value.items[price > 3].name"),
        paths(&[&["value", "items"]])
    );
    assert_eq!(
        reads("$map(value, function($v) { $v.fields.x })"),
        paths(&[&["value"]])
    );
    assert_eq!(reads("true"), paths(&[]));
}
