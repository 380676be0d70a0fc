//! What the project's YAML reader does with the YAML users write.

use super::*;
use serde::Deserialize;
use serde_json::json;

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Lease {
    enabled: bool,
    lease_duration_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    namespaces: Vec<String>,
    leader_election: Option<Lease>,
    name: Option<String>,
}

#[test]
fn a_field_that_does_not_fit_is_named_by_its_path() {
    let err = from_str::<Config>(
        "namespaces: [a]\nleaderElection:\n  enabled: true\n  leaseDurationSeconds: abc\n",
    )
    .unwrap_err();
    assert_eq!(
        err,
        YamlError::Field {
            path: "leaderElection.leaseDurationSeconds".into(),
            message: "invalid type: string \"abc\", expected u64".into(),
        }
    );
    let err =
        from_str::<Config>("namespaces: [a]\nleaderElection: {enabled: true, leaseDuration: 3}\n")
            .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("leaderElection.leaseDuration: unknown field `leaseDuration`"),
        "{err}"
    );
    let err = from_str::<Config>("namespaces: [a, 7]\n").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("namespaces[1]: invalid type: integer `7`"),
        "{err}"
    );
}

#[test]
fn a_number_where_a_string_belongs_is_refused_as_the_api_server_refuses_it() {
    let err = from_str::<Config>("namespaces: []\nname: 3.5\n").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("name: invalid type: floating point `3.5`"),
        "{err}"
    );
    assert_eq!(
        from_str::<Config>("namespaces: []\nname: '3.5'\n")
            .unwrap()
            .name
            .as_deref(),
        Some("3.5")
    );
}

#[test]
fn duplicate_keys_are_refused_with_line_and_column() {
    let err = from_str::<Config>("namespaces: [a]\nnamespaces: [b]\n").unwrap_err();
    let YamlError::Syntax(message) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(
        message,
        "duplicate mapping key: namespaces at line 2, column 1"
    );
}

#[test]
fn anchors_aliases_and_merge_keys_expand() {
    let v = value("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\nsame: *b\n").unwrap();
    assert_eq!(
        v,
        json!({"base": {"x": 1, "y": 2}, "other": {"x": 1, "y": 3}, "same": {"x": 1, "y": 2}})
    );
}

#[test]
fn only_true_and_false_are_booleans_as_in_yaml_1_2() {
    let v = value("y: yes\non: off\nn: no\nt: true\nmode: 0755\nbig: 1_000\n").unwrap();
    assert_eq!(
        v,
        json!({"y": "yes", "on": "off", "n": "no", "t": true, "mode": "0755", "big": "1_000"})
    );
}

#[test]
fn an_alias_bomb_is_refused_before_it_expands() {
    let mut text = "a: &a [x, x, x, x, x, x, x, x, x]\n".to_string();
    for (name, prev) in ["b", "c", "d", "e", "f", "g", "h", "i"]
        .iter()
        .zip(["a", "b", "c", "d", "e", "f", "g", "h"])
    {
        let refs = vec![format!("*{prev}"); 9].join(", ");
        text.push_str(&format!("{name}: &{name} [{refs}]\n"));
    }
    let err = value(&text).unwrap_err();
    assert!(err.to_string().contains("budget breached"), "{err}");
}

#[test]
fn integers_keep_their_value_up_to_u64_and_numbers_past_it_become_floats_as_in_json() {
    let v =
        value("max: 18446744073709551615\nmin: -9223372036854775808\npast: 18446744073709551616\n")
            .unwrap();
    assert_eq!(v["max"].as_u64(), Some(u64::MAX));
    assert_eq!(v["min"].as_i64(), Some(i64::MIN));
    assert_eq!(v["past"].as_f64(), Some(18446744073709551616.0));
}

#[test]
fn a_stream_gives_its_non_empty_documents_in_order_and_fails_whole_on_a_syntax_error() {
    let docs = documents("a: 1\n---\n---\n# only a comment\n---\nb: 2\n").unwrap();
    assert_eq!(docs, vec![json!({"a": 1}), json!({"b": 2})]);
    assert!(documents("").unwrap().is_empty());
    let err = documents("a: 1\n---\nb: [1, 2\nc: 3\n").unwrap_err();
    assert!(err.to_string().contains("line 4"), "{err}");
}

#[test]
fn written_yaml_reads_back_the_same_and_quotes_what_yaml_1_1_would_misread() {
    let original = json!({
        "spec": {"list": [{"a": 1, "b": "yes"}, {"c": "3.5"}], "empty": [], "map": {},
                 "text": "two\nlines\n", "none": null, "on": true, "digits": "0123", "star": "*x"}
    });
    let text = to_string(&original).unwrap();
    assert!(text.contains("b: \"yes\""), "{text}");
    assert!(text.contains("c: \"3.5\""), "{text}");
    assert_eq!(value(&text).unwrap(), original);
}
