module github.com/multicluster-runtime/multicluster-runtime-rs/hack/helm

go 1.26.0

require helm.sh/helm/v4 v4.3.2
