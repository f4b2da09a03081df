#!/usr/bin/env bash
# Creates a kubeconfig Secret for the kubeconfig provider: a service account
# in a member cluster, a token for it, and a Secret in the management cluster
# holding a kubeconfig that uses that token.
#
#   hack/create-kubeconfig-secret.sh --name prod-eu \
#       --member-context prod-eu --management-context mgmt \
#       [--namespace fleet] [--service-account multicluster-runtime] \
#       [--for configmaps|fleet-quota|webhook] [--cluster-role NAME]
#       [--duration 8760h] [--label KEY=VALUE ...]
#
# --label adds a label to the Secret besides the provider's own, once per
# label: a watch filter (cluster.x-k8s.io/watch-filter=instance-b), or what
# a member selector or rollout stage picks clusters by (tier=canary).
#
# By default the service account gets what the examples need in a member and
# no more, by --for (default configmaps): a ClusterRole
# multicluster-runtime-<for> (created here) with
#   configmaps   get, list, watch, create, update, patch, delete on configmaps
#                (examples/kubeconfig, fleet-propagation, placement)
#   fleet-quota  get, list, watch, create, patch, delete on resourcequotas
#                (examples/fleet-quota)
#   webhook      get, list, watch, create, update, patch, delete on
#                validating and mutating webhook configurations
#                (examples/webhook)
# and create and patch on events (a controller's warning Events about
# objects in the member). With --cluster-role it is bound to that existing
# ClusterRole instead (view, edit, one of your own).
#
# The token is a bound token from the TokenRequest API (`kubectl create
# token`); rotate it by running the script again, which replaces the Secret
# (the provider re-engages the cluster at once).
set -euo pipefail

name="" member_context="" management_context="" namespace="fleet"
service_account="multicluster-runtime" cluster_role="" duration="8760h" for="configmaps"
label="sigs.k8s.io/multicluster-runtime-kubeconfig"
labels=()
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --member-context) member_context=$2; shift 2 ;;
    --management-context) management_context=$2; shift 2 ;;
    --namespace) namespace=$2; shift 2 ;;
    --service-account) service_account=$2; shift 2 ;;
    --cluster-role) cluster_role=$2; shift 2 ;;
    --for) for=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --label)
      case "$2" in
        *=*) labels+=("$2") ;;
        *) echo "--label takes KEY=VALUE, not $2" >&2; exit 2 ;;
      esac
      shift 2 ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$name" ] || { echo "--name is required (the cluster's name in the fleet)" >&2; exit 2; }

member() { kubectl ${member_context:+--context "$member_context"} "$@"; }
management() { kubectl ${management_context:+--context "$management_context"} "$@"; }

member create namespace multicluster-runtime --dry-run=client -o yaml | member apply -f - >/dev/null
member -n multicluster-runtime create serviceaccount "$service_account" --dry-run=client -o yaml | member apply -f - >/dev/null
if [ -z "$cluster_role" ]; then
  case "$for" in
    configmaps) resources=configmaps verbs=get,list,watch,create,update,patch,delete ;;
    fleet-quota) resources=resourcequotas verbs=get,list,watch,create,patch,delete ;;
    webhook) resources=validatingwebhookconfigurations.admissionregistration.k8s.io,mutatingwebhookconfigurations.admissionregistration.k8s.io
             verbs=get,list,watch,create,update,patch,delete ;;
    *) echo "--for must be configmaps, fleet-quota or webhook, not $for" >&2; exit 2 ;;
  esac
  cluster_role="multicluster-runtime-$for"
  # One rule for the resources, one for Events: `kubectl create clusterrole`
  # gives every resource the same verbs, so the role is applied as YAML.
  member apply -f - >/dev/null <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: $cluster_role
rules:
$(member create clusterrole "$cluster_role" --resource="$resources" --verb="$verbs" --dry-run=client -o yaml \
    | sed -n '/^rules:/,$p' | tail -n +2)
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
YAML
  echo "ClusterRole $cluster_role: ${verbs//,/, } on ${resources//,/ and }; create, patch on events"
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
  --dry-run=client -o yaml | management label -f - --local -o yaml "$label=true" ${labels[@]+"${labels[@]}"} | management apply -f - >/dev/null
echo "Secret $namespace/$name created in the management cluster for cluster $cluster ($server)"
