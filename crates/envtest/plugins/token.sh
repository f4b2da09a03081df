#!/bin/sh
# A test exec credential plugin (client.authentication.k8s.io/v1).
#
# Its state lives in the directory named by $STATE_DIR (a profile passes it
# through the additional-envs extension):
#   token  the bearer token to hand out (read at every call, so tests can
#          rotate it); without it the plugin fails, echoing its arguments
#          and $API_KEY on stdout;
#   ttl    if present, seconds until the token expires, which makes the
#          client call the plugin again before that;
#   delay  if present, seconds to take before answering (benchmarks stand in
#          for slow identity services with it);
#   hold   while it exists (up to 2 minutes), the plugin does not answer:
#          tests release it by removing the file;
#   calls  one line appended per call: its process ID, its arguments, two
#          variables and the KUBERNETES_EXEC_INFO it was given, tab-separated.
set -eu
dir=${STATE_DIR:?STATE_DIR is not set}
printf 'pid=%s\targs=%s\tKEEP=%s\tREGION=%s\tinfo=%s\n' \
  "$$" "$*" "${KEEP-}" "${REGION-}" "${KUBERNETES_EXEC_INFO-}" >> "$dir/calls"
if [ -e "$dir/hold" ]; then
  deadline=$(( $(date +%s) + 120 ))
  while [ -e "$dir/hold" ]; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "held for too long" >&2
      exit 1
    fi
    sleep 0.05
  done
fi
if [ ! -s "$dir/token" ]; then
  # Half an answer, as failing plugins give: its arguments and $API_KEY,
  # which must never reach an error message or a log.
  echo "{\"partial\": \"$* ${API_KEY-}\""
  echo "identity service: no token for this cluster" >&2
  exit 1
fi
if [ -s "$dir/delay" ]; then
  sleep "$(cat "$dir/delay")"
fi
token=$(cat "$dir/token")
expiry=
if [ -s "$dir/ttl" ]; then
  expiry=$(date -u -d "+$(cat "$dir/ttl") seconds" +%Y-%m-%dT%H:%M:%SZ)
  expiry=",\"expirationTimestamp\":\"$expiry\""
fi
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"%s}}\n' \
  "$token" "$expiry"
