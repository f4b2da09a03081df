# multicluster-runtime for Rust. Every target prepares what it needs.
SHELL := /usr/bin/env bash

.PHONY: all test test-tools test-build nextest lint fmt bench demo controlplane helm kind jaeger tools examples publish-check template

all: lint test

## controlplane: build (first run) or reuse the cached etcd/kube-apiserver binaries
controlplane:
	@hack/controlplane/build.sh >/dev/null

## helm: build (first run) or reuse the cached helm the chart's tests and lint run
helm:
	@hack/helm/build.sh >/dev/null

## kind: build (first run) or reuse the cached kind CLI the kind provider's tests run
kind:
	@hack/kind/build.sh >/dev/null

## jaeger: build (first run) or reuse the cached Jaeger the trace tests export to
jaeger:
	@hack/jaeger/build.sh >/dev/null

## tools: command-line tools the tests call (kubectl; podman, runc and busybox for kind nodes)
tools:
	@hack/ensure-tools.sh

## test: the whole test suite against real control planes
test:
	@$(MAKE) --no-print-directory -j2 test-tools test-build
	hack/test-all.sh

## nextest: build (first run) or reuse the cached cargo-nextest the tests run under
nextest:
	@hack/nextest.sh >/dev/null

# What the tests need, in two lanes that do not wait for each other: the
# tools built with Go (and Debian's packages), one after another, beside
# the one cargo build at a time (nextest, then the workspace's tests). On a
# fresh machine the two take about as long each.
test-tools:
	@MAKEFLAGS= $(MAKE) --no-print-directory controlplane tools helm kind jaeger

test-build: nextest
	cargo test --workspace --no-run --lib --bins --tests --examples --quiet

## lint: formatting and clippy with warnings as errors
lint:
	hack/lint.sh

## template: generate a project from templates/fleet-controller per provider (real cargo-generate) and run its test
template: controlplane
	hack/template/test.sh

## publish-check: every library crate packages and builds on its own (cargo publish --dry-run)
publish-check:
	hack/publish-check.sh

## fmt: format the workspace
fmt:
	cargo fmt --all

## bench: benchmarks (figures go to BENCHMARKS.md)
bench: controlplane
	hack/bench.sh

## demo: a local control plane, three namespaces, and examples/namespace reconciling them (Ctrl-C stops)
demo:
	hack/demo.sh
