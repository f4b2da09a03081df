//go:build tools

// Package krew pins the krew release whose manifest validator checks the
// kubectl plugin's krew manifest in `make lint`. Nothing here is compiled
// into the project: the import only makes `go build` resolve the command
// at the version in go.mod.
package krew

import (
	_ "sigs.k8s.io/krew/cmd/validate-krew-manifest"
)
