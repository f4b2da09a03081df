//go:build tools

// Package helm pins the Helm release the chart's tests and lint run. Nothing
// here is compiled into the project: the import only makes `go build`
// resolve the command at the version in go.mod.
package helm

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
