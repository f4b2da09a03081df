//go:build tools

// Package kind pins the kind release the kind provider's tests run. Nothing
// here is compiled into the project: the import only makes `go build`
// resolve the command at the version in go.mod.
package kind

import (
	_ "sigs.k8s.io/kind"
)
