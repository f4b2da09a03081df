#!/bin/sh
# A test exec credential plugin (client.authentication.k8s.io/v1).
#
# Its state lives in the directory named by $STATE_DIR (a profile passes it
# through the additional-envs extension):
#   token  the bearer token to hand out (read at every call, so tests can
#          rotate it); without it the plugin fails, echoing its arguments
#          and $API_KEY on stdout, a diagnostic and then its whole
#          environment (on one line) on stderr;
#   cert,  if present, a client certificate and its key (PEM) to hand out
#   key    instead of the token (read at every call, so tests can switch
#          to a certificate or rotate it);
#   ttl    if present, seconds until the credential expires, which makes
#          the client call the plugin again before that;
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
if [ ! -s "$dir/token" ] && [ ! -s "$dir/cert" ]; then
  # Half an answer, as failing plugins give: its arguments and $API_KEY,
  # which must never reach an error message or a log.
  echo "{\"partial\": \"$* ${API_KEY-}\""
  # A diagnostic on stderr, then its whole environment on one line, as
  # plugins debugging a failure print it.
  echo "identity service: no token for this cluster" >&2
  echo "environment: $(env | tr '\n' ' ')" >&2
  exit 1
fi
if [ -s "$dir/delay" ]; then
  sleep "$(cat "$dir/delay")"
fi
expiry=
if [ -s "$dir/ttl" ]; then
  expiry=$(date -u -d "+$(cat "$dir/ttl") seconds" +%Y-%m-%dT%H:%M:%SZ)
  expiry=",\"expirationTimestamp\":\"$expiry\""
fi
if [ -s "$dir/cert" ]; then
  # PEM in a JSON string: its line breaks written as \n.
  pem() { awk 'BEGIN { ORS = "\\n" } { print }' "$1"; }
  printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientCertificateData":"%s","clientKeyData":"%s"%s}}\n' \
    "$(pem "$dir/cert")" "$(pem "$dir/key")" "$expiry"
  exit 0
fi
token=$(cat "$dir/token")
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"%s}}\n' \
  "$token" "$expiry"
