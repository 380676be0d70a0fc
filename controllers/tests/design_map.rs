//! `docs/design.md` is the map of the code: its two rule lists name the
//! admission rules and the planner rules the code has, in the code's order.
//! A rule added, removed, renamed or moved without the map fails here.

use etcdfleet_controllers::etcdcluster::{admission, plan};

/// The bold names of the numbered list under `heading` in the map.
fn listed(map: &str, heading: &str) -> Vec<String> {
    let start = map
        .find(heading)
        .unwrap_or_else(|| panic!("docs/design.md has no heading {heading:?}"));
    map[start + heading.len()..]
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("1."))
        .take_while(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
        .map(|l| {
            let name = l
                .split("**")
                .nth(1)
                .unwrap_or_else(|| panic!("no bold name: {l}"));
            name.to_string()
        })
        .collect()
}

fn map() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/design.md");
    std::fs::read_to_string(path).expect("docs/design.md")
}

#[test]
fn the_map_lists_the_admission_rules_in_their_order() {
    let code: Vec<&str> = admission::RULES.iter().map(|(name, _)| *name).collect();
    assert_eq!(listed(&map(), "### Admission rules"), code);
}

#[test]
fn the_map_lists_the_planner_rules_in_their_order() {
    let code: Vec<&str> = plan::RULES.iter().map(|(name, _)| *name).collect();
    assert_eq!(listed(&map(), "### Planner rules"), code);
}
