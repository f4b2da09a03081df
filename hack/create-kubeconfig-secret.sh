#!/usr/bin/env bash
# Creates a kubeconfig Secret for the kubeconfig provider: a service account
# in a member cluster, a token for it, and a Secret in the management cluster
# holding a kubeconfig that uses that token.
#
#   hack/create-kubeconfig-secret.sh --name prod-eu \
#       --member-context prod-eu --management-context mgmt \
#       [--namespace fleet] [--service-account multicluster-runtime] \
#       [--cluster-role NAME] [--duration 8760h]
#
# By default the service account gets what examples/kubeconfig needs and no
# more: a ClusterRole multicluster-runtime-configmap-sync (created here) with
# get, list, watch, create, update, patch and delete on configmaps. With
# --cluster-role it is bound to that existing ClusterRole instead (view,
# edit, one of your own).
#
# The token is a bound token from the TokenRequest API (`kubectl create
# token`); rotate it by running the script again, which replaces the Secret
# (the provider re-engages the cluster at once).
set -euo pipefail

name="" member_context="" management_context="" namespace="fleet"
service_account="multicluster-runtime" cluster_role="" duration="8760h"
label="sigs.k8s.io/multicluster-runtime-kubeconfig"
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --member-context) member_context=$2; shift 2 ;;
    --management-context) management_context=$2; shift 2 ;;
    --namespace) namespace=$2; shift 2 ;;
    --service-account) service_account=$2; shift 2 ;;
    --cluster-role) cluster_role=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$name" ] || { echo "--name is required (the cluster's name in the fleet)" >&2; exit 2; }

member() { kubectl ${member_context:+--context "$member_context"} "$@"; }
management() { kubectl ${management_context:+--context "$management_context"} "$@"; }

member create namespace multicluster-runtime --dry-run=client -o yaml | member apply -f - >/dev/null
member -n multicluster-runtime create serviceaccount "$service_account" --dry-run=client -o yaml | member apply -f - >/dev/null
if [ -z "$cluster_role" ]; then
  cluster_role="multicluster-runtime-configmap-sync"
  member create clusterrole "$cluster_role" --resource=configmaps \
    --verb=get,list,watch,create,update,patch,delete --dry-run=client -o yaml | member apply -f - >/dev/null
  echo "ClusterRole $cluster_role: get, list, watch, create, update, patch, delete on configmaps (what examples/kubeconfig needs)"
fi
member create clusterrolebinding "multicluster-runtime-$service_account" --clusterrole "$cluster_role" \
  --serviceaccount "multicluster-runtime:$service_account" --dry-run=client -o yaml | member apply -f - >/dev/null
token=$(member -n multicluster-runtime create token "$service_account" --duration "$duration")

cluster=$(member config view --minify --raw -o jsonpath='{.contexts[0].context.cluster}')
server=$(member config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')
ca=$(member config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
if [ -z "$ca" ]; then
  ca_file=$(member config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')
  [ -n "$ca_file" ] && ca=$(base64 -w0 < "$ca_file")
fi

kubeconfig=$(mktemp)
trap 'rm -f "$kubeconfig"' EXIT
cat > "$kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: $cluster
  cluster:
    server: $server
${ca:+    certificate-authority-data: $ca}
contexts:
- name: $name
  context:
    cluster: $cluster
    user: $service_account
current-context: $name
users:
- name: $service_account
  user:
    token: $token
YAML

management create namespace "$namespace" --dry-run=client -o yaml | management apply -f - >/dev/null
management -n "$namespace" create secret generic "$name" --from-file=kubeconfig="$kubeconfig" \
  --dry-run=client -o yaml | management label -f - --local -o yaml "$label=true" | management apply -f - >/dev/null
echo "Secret $namespace/$name created in the management cluster for cluster $cluster ($server)"
