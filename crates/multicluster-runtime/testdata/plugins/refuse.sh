#!/bin/sh
# An exec credential plugin that fails the way real ones do: some output,
# a diagnostic on stderr, a non-zero exit. It echoes its secret env value and
# arguments so tests can check they never reach an error message.
echo "{\"half\": \"$PLUGIN_SECRET $*\""
echo "looking up credentials" >&2
echo "no access to this cluster" >&2
exit 3
