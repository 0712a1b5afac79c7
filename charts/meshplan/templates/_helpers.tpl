{{/* Chart name, cut to 63 characters (a DNS label). */}}
{{- define "meshplan.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name prefix: fullnameOverride, else <release>-<chart> (or <release> when it already says the chart). */}}
{{- define "meshplan.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "meshplan.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades (a Deployment selector is immutable). */}}
{{- define "meshplan.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meshplan.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "meshplan.labels" -}}
helm.sh/chart: {{ include "meshplan.chart" . }}
{{ include "meshplan.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: meshplan
{{- end }}

{{- define "meshplan.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "meshplan.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag or repository@digest */}}
{{- define "meshplan.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* `--all-namespaces` or one `--namespace NS` per watched namespace (shared by the operator and the cleanup hook). */}}
{{- define "meshplan.scopeArgs" -}}
{{- if .Values.watch.allNamespaces }}
- --all-namespaces
{{- else }}
{{- if not .Values.watch.namespaces }}
{{- fail "watch.namespaces must list at least one namespace when watch.allNamespaces is false" }}
{{- end }}
{{- range .Values.watch.namespaces }}
- --namespace
- {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Pod and container security contexts that pass the `restricted` Pod Security
Standard (https://kubernetes.io/docs/concepts/security/pod-security-standards/):
non-root, no privilege escalation, all capabilities dropped, RuntimeDefault
seccomp, read-only root filesystem (writable /tmp from an emptyDir).
The uid/gid 10001 is the USER of the Dockerfile.
*/}}
{{- define "meshplan.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "meshplan.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
RBAC rules, least privilege, no wildcards; API groups never carry a version.
Cluster-scoped kinds always go in a ClusterRole; the workload rules go in a
ClusterRole when watching all namespaces, else in one Role per watched namespace.
*/}}
{{- define "meshplan.clusterRules" -}}
# Topology: GPU labels and allocatable of every node (meshplan.topology).
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
# kopf scans CRDs to resolve the resources it serves, and lists/watches
# namespaces to resolve namespace patterns.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- if not .Values.watch.allNamespaces }}
# A namespace-scoped operator still shares nodes with every namespace: it lists
# GPU-holding pods cluster-wide to know the free GPUs (controller/reconcile.py,
# ForeignUsage). List only: no watch, no get, no write outside its namespaces.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
{{- end }}
{{- if and .Values.peering.enabled .Values.watch.allNamespaces }}
# kopf peering of a cluster-wide operator: keep-alives in the ClusterKopfPeering status.
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}

{{- define "meshplan.workloadRules" -}}
# The custom resource, its status and its finalizers (kopf's finalizer; owner
# references with blockOwnerDeletion need update on llmdeployments/finalizers).
- apiGroups: ["meshplan.dev"]
  resources: ["llmdeployments"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["meshplan.dev"]
  resources: ["llmdeployments/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["meshplan.dev"]
  resources: ["llmdeployments/finalizers"]
  verbs: ["update"]
# Children: replica-group pods (usage is read from pods too) and Services.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# TensorRT-LLM multi-node deployments: the operator creates one Secret per deployment with the ssh keys
# of its MPI world (meshplan.engines.trtllm_ssh); it never lists or watches Secrets.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch"]
# kopf and the controller post Events on the LLMDeployment.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# Disaggregated deployments (spec.serving.disaggregation, issue 19): the InferencePool of the Gateway API
# Inference Extension, its endpoint picker's Deployment and ServiceAccount, and the picker's Role/RoleBinding
# (read pods and inferencepools in its namespace: the operator holds those rights itself, which RBAC requires
# of whoever grants them). Read by name, never listed or watched (except inferencepools: granted to the picker).
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch", "delete"]
{{- if and .Values.peering.enabled (not .Values.watch.allNamespaces) }}
# kopf peering of a namespaced operator: keep-alives in each namespace's KopfPeering.
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- if .Values.computeDomains.enabled }}
# Multi-node NVLink (IMEX) channels for GB200 NVL72 replicas (NVIDIA DRA driver).
- apiGroups: ["resource.nvidia.com"]
  resources: ["computedomains"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
{{- end }}
{{- end }}

{{/* The pre-delete hook deletes LLMDeployments, waits, and may drop meshplan's finalizer. */}}
{{- define "meshplan.cleanupRules" -}}
- apiGroups: ["meshplan.dev"]
  resources: ["llmdeployments"]
  verbs: ["get", "list", "watch", "delete", "patch"]
{{- end }}
