#!/bin/sh
# A test exec credential plugin that always fails, the way real ones do:
# half an answer on stdout (echoing its arguments and $API_KEY, so tests can
# check neither reaches an error message), its environment and a diagnostic
# on stderr, exit 1.
# With $STATE_DIR set, each call appends a line to $STATE_DIR/calls so tests
# can see it being retried.
if [ -n "${STATE_DIR-}" ]; then
  echo "called" >> "$STATE_DIR/calls"
fi
echo "{\"partial\": \"$* ${API_KEY-}\""
echo "looking up credentials" >&2
# Its environment, as plugins debugging a failure print it.
env >&2
echo "identity service: no grant for this cluster" >&2
exit 1
