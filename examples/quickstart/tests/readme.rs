//! The core README's first example is this example, word for word, so the
//! program a newcomer copies is one that CI compiles.

#[test]
fn the_core_readme_shows_this_example_as_it_is() {
    let readme = include_str!("../../../crates/multicluster-runtime/README.md");
    let main = include_str!("../src/main.rs");
    assert!(
        readme.contains(main),
        "crates/multicluster-runtime/README.md must hold examples/quickstart/src/main.rs as it is"
    );
    let manifest = include_str!("../Cargo.toml");
    for dependency in [
        "multicluster-provider-kubeconfig",
        "k8s-openapi",
        "kube",
        "tokio",
        "tracing-subscriber",
    ] {
        assert!(manifest.contains(dependency), "{dependency}");
        assert!(
            readme.contains(&format!("\n{dependency} = ")),
            "the README's Cargo.toml lines name {dependency}"
        );
    }
}
