#!/bin/sh
# An exec credential plugin that answers only once the file named by its
# first argument exists (giving up after 10 s). A test creates the file from
# the async runtime thread, which can only happen if the plugin does not run
# on that thread.
deadline=$(( $(date +%s) + 10 ))
while [ ! -e "$1" ]; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "gave up waiting for $1" >&2
    exit 1
  fi
  sleep 0.05
done
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-plugin"}}\n'
