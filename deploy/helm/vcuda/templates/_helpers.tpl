{{/* Names, labels and the values several templates share. */}}

{{/* The prefix of every object's name: the release name, or <release>-vcuda when it lacks "vcuda". */}}
{{- define "vcuda.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "vcuda.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/part-of: vcuda
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* Selector labels of one component: include "vcuda.selector" (list . "device-plugin"). */}}
{{- define "vcuda.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ printf "%s-%s" (include "vcuda.fullname" $root) (index . 1) }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
{{- end -}}

{{/* Labels of one component's objects: the common ones and its name. */}}
{{- define "vcuda.componentLabels" -}}
{{ include "vcuda.labels" (index . 0) }}
app.kubernetes.io/name: {{ printf "%s-%s" (include "vcuda.fullname" (index . 0)) (index . 1) }}
{{- end -}}

{{- define "vcuda.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The vgpu resources, the ones the extender places. */}}
{{- define "vcuda.coreResource" -}}{{ .Values.resourceDomain }}/vcuda-core{{- end -}}
{{- define "vcuda.memoryResource" -}}{{ .Values.resourceDomain }}/vcuda-memory{{- end -}}

{{- define "vcuda.optOut" -}}{{ join "," .Values.allowOptOutNamespaces }}{{- end -}}

{{- define "vcuda.extenderName" -}}{{ include "vcuda.fullname" . }}-extender{{- end -}}
{{- define "vcuda.schedulerFullname" -}}{{ include "vcuda.fullname" . }}-scheduler{{- end -}}
{{- define "vcuda.webhookService" -}}{{ include "vcuda.fullname" . }}-webhook{{- end -}}
{{- define "vcuda.webhookSecret" -}}{{ include "vcuda.fullname" . }}-webhook-tls{{- end -}}
{{- define "vcuda.webhookConfiguration" -}}{{ include "vcuda.fullname" . }}-webhook{{- end -}}
{{- define "vcuda.migConfigMap" -}}{{ include "vcuda.fullname" . }}-mig-parted-config{{- end -}}

{{/* The resources whose pods the webhook sends to vcuda-scheduler (--webhook-resources). */}}
{{- define "vcuda.webhookResources" -}}
{{- $r := list (include "vcuda.coreResource" .) (include "vcuda.memoryResource" .) -}}
{{- if .Values.webhook.pgpu }}{{ $r = append $r "nvidia.com/gpu" }}{{ end -}}
{{- if .Values.webhook.mps }}{{ $r = append $r "nvidia.com/mps-core" }}{{ end -}}
{{- join "," $r -}}
{{- end -}}

{{/* imagePullSecrets of a pod spec, when any ("" otherwise). */}}
{{- define "vcuda.pullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/*
The init step of the vgpu agent and the DRA driver: puts libvcuda.so on the host, where kubelet
(or the CDI specs) mount it into containers. It needs nothing but libc at run time (it speaks ZMTP
itself), which every image has; the check fails the pod if a build ever adds another dependency.
Copy, then rename: running containers keep the old file's inode, new ones get the new library.
*/}}
{{- define "vcuda.installLibvcuda" -}}
- name: install-libvcuda
  image: {{ include "vcuda.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - /bin/sh
    - -ec
    - |
      lib="$(vcuda lib-path)"
      extra="$(ldd "$lib" | grep -v -E 'linux-vdso|ld-linux|libc\.so|libdl\.so|libpthread\.so' || true)"
      if [ -n "$extra" ]; then echo "libvcuda.so needs more than libc: $extra" >&2; exit 1; fi
      cp "$lib" /host-lib/.libvcuda.so.new
      chmod 0755 /host-lib/.libvcuda.so.new
      mv -f /host-lib/.libvcuda.so.new /host-lib/libvcuda.so
      echo "installed $lib as /usr/local/vcuda/lib/libvcuda.so on the host"
      {{- if .Values.testing.simulator }}
      # TEST ONLY (testing.simulator): the GPU simulator's stand-in driver libraries beside it
      for sim in libvcuda-sim-cuda.so libvcuda-sim-nvml.so; do
        cp "$(dirname "$lib")/$sim" "/host-lib/.$sim.new"
        chmod 0755 "/host-lib/.$sim.new"
        mv -f "/host-lib/.$sim.new" "/host-lib/$sim"
      done
      echo "installed the GPU simulator's libraries in /usr/local/vcuda/lib on the host (testing.simulator)"
      {{- end }}
  volumeMounts:
    - {name: host-lib, mountPath: /host-lib}
  securityContext:
    runAsUser: 0
    allowPrivilegeEscalation: false
    capabilities: {drop: ["ALL"]}
{{- end -}}

{{/*
TEST ONLY (testing.simulator): a node agent on the GPU simulator. Its env (gpusim's settings, the
simulator's libraries as the driver, installed by the init step), the state's hostPath at the same
path (the agent hands host paths to containers), and the flag that hands the simulator on
(node_state/gpu_driver.py). Each renders nothing without testing.simulator.
*/}}
{{- define "vcuda.simulatorArgs" -}}
{{- if .Values.testing.simulator }}
- --simulator
{{- end }}
{{- end -}}

{{- define "vcuda.simulatorEnv" -}}
{{- if .Values.testing.simulator }}
{{- $n := .Values.testing.simulatedNode }}
- {name: VCUDA_REAL_LIBCUDA, value: /usr/local/vcuda/lib/libvcuda-sim-cuda.so}
- {name: VCUDA_REAL_LIBNVML, value: /usr/local/vcuda/lib/libvcuda-sim-nvml.so}
- {name: VCUDA_SIM_STATE, value: {{ printf "%s/state" (trimSuffix "/" $n.stateDir) | quote }}}
- {name: VCUDA_SIM_DEVICES, value: {{ $n.devices | int | toString | quote }}}
- {name: VCUDA_SIM_MEMORY, value: {{ $n.memory | int64 | toString | quote }}}
- {name: VCUDA_SIM_MIG, value: {{ $n.mig | quote }}}
- {name: VCUDA_SIM_MIG_MODEL, value: {{ $n.migModel | quote }}}
{{- end }}
{{- end -}}

{{- define "vcuda.simulatorMount" -}}
{{- if .Values.testing.simulator }}
- {name: simulator, mountPath: {{ .Values.testing.simulatedNode.stateDir }}}
{{- end }}
{{- end -}}

{{- define "vcuda.simulatorVolume" -}}
{{- if .Values.testing.simulator }}
- name: simulator   # TEST ONLY: the GPU simulator's shared state, mounted into every GPU container too
  hostPath: {path: {{ .Values.testing.simulatedNode.stateDir }}, type: DirectoryOrCreate}
{{- end }}
{{- end -}}

{{/* Node selector of a node agent: its own label, then the chart-wide one. */}}
{{- define "vcuda.agentNodeSelector" -}}
{{- $root := index . 0 -}}
{{- $own := dict (index . 1) (index . 2) -}}
nodeSelector:
  {{- toYaml (merge $own (deepCopy $root.Values.nodeSelector)) | nindent 2 }}
{{- end -}}
