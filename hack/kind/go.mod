module github.com/multicluster-runtime/multicluster-runtime-rs/hack/kind

go 1.26.0

require sigs.k8s.io/kind v0.33.0
