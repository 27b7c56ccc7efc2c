//! The README is where ML teams look up annotations and presets: it must say what the code does.

use std::path::Path;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

#[test]
fn readme_lists_every_model_preset() {
    let readme = readme();
    for row in peakfit::model::presets::markdown_table().lines() {
        assert!(
            readme.contains(row),
            "README.md lacks the preset row\n{row}"
        );
    }
}

#[test]
fn readme_documents_every_annotation_the_parser_accepts() {
    let readme = readme();
    for key in peakfit::model::annotations::INPUT_KEYS {
        assert!(
            readme.contains(&format!("| `{key}` |")),
            "README.md lacks annotation `{key}`"
        );
    }
}

/// The parser's module documentation and the README carry the same annotation table; a row edited in
/// one place only (a range, a default) would leave one of them wrong.
#[test]
fn readme_annotation_rows_match_the_parsers_documentation() {
    let readme = readme();
    let source = include_str!("../crates/peakfit-core/src/model/annotations.rs");
    let rows: Vec<&str> = source
        .lines()
        .filter_map(|l| l.strip_prefix("//! "))
        .filter(|l| l.starts_with("| `"))
        .collect();
    assert!(rows.len() >= peakfit::model::annotations::INPUT_KEYS.len());
    for row in rows {
        assert!(
            readme.contains(row),
            "README.md differs from crates/peakfit-core/src/model/annotations.rs in\n{row}"
        );
    }
}
