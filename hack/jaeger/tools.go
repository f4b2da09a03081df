//go:build tools

// Package jaeger pins the Jaeger release the trace tests export to (its
// OTLP receiver, in-memory store and query API). Nothing here is compiled
// into the project: the import only makes `go build` resolve the command
// at the version in go.mod.
package jaeger

import (
	_ "github.com/jaegertracing/jaeger/cmd/jaeger"
)
