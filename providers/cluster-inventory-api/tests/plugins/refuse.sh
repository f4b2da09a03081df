#!/bin/sh
# A test exec credential plugin that always fails, the way real ones do: a
# diagnostic on stderr and a non-zero exit. Each call appends a line to
# $STATE_DIR/calls so tests can see it being retried.
if [ -n "${STATE_DIR-}" ]; then
  echo "called" >> "$STATE_DIR/calls"
fi
echo "identity service: no grant for this cluster" >&2
exit 1
