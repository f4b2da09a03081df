//! The README lists the flags as `--help` prints them.

#[test]
fn the_readme_lists_the_flags_help_prints() {
    multicluster_example_testing::readme::flags_match(
        env!("CARGO_BIN_EXE_multicluster-example-kind"),
        env!("CARGO_MANIFEST_DIR"),
    );
}
