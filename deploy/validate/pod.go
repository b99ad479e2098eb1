package validate

import (
	"fmt"
	"net"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/rebound-mq/rebound/config"
)

// ContainerName is the name of rebound's container in every layout.
const ContainerName = "rebound"

// ImageUID is the user and group the release image runs as
// (tools/release, imageUID; its tests check the image's config).
const ImageUID = 65532

// Layout is how rebound sits in the pod.
type Layout int

const (
	// NativeSidecar: an init container with restartPolicy Always
	// (Kubernetes 1.29+), started before and stopped after the app.
	NativeSidecar Layout = iota
	// TwoContainers: an ordinary second container, for older clusters.
	TwoContainers
	// Standalone: rebound alone in its pod, one Deployment for the vhost.
	Standalone
)

func (l Layout) String() string {
	switch l {
	case NativeSidecar:
		return "native sidecar"
	case Standalone:
		return "standalone"
	}
	return "two containers"
}

// LoadConfigMap runs config.Load on the ConfigMap's data, as envFrom hands
// it to rebound, with REBOUND_AMQP_URL_FILE naming a file in dir that holds
// url (the manifests mount the real one from a Secret). It also reports
// keys that are not REBOUND_* variables config.Load reads (its warnings: a
// misspelt key would leave a default in force), and a broker URL in the
// ConfigMap, where it would be readable by anyone who can read ConfigMaps.
func LoadConfigMap(cm *corev1.ConfigMap, dir, url string) (config.Config, []string) {
	var problems []string
	keys := make([]string, 0, len(cm.Data))
	for k := range cm.Data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	environ := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		switch {
		case !strings.HasPrefix(k, config.Prefix):
			problems = append(problems, fmt.Sprintf("ConfigMap %s: key %s is not a variable rebound reads", cm.Name, k))
		case k == config.Prefix+"AMQP_URL" || k == config.Prefix+"AMQP_URL_FILE":
			problems = append(problems, fmt.Sprintf("ConfigMap %s: %s belongs in the Secret-mounted file, not in a ConfigMap", cm.Name, k))
		}
		environ = append(environ, k+"="+cm.Data[k])
	}
	if len(cm.BinaryData) > 0 {
		problems = append(problems, fmt.Sprintf("ConfigMap %s: binaryData is not passed as environment variables", cm.Name))
	}
	file := path.Join(dir, "amqp-url")
	if err := os.WriteFile(file, []byte(url+"\n"), 0o600); err != nil {
		return config.Config{}, append(problems, err.Error())
	}
	environ = append(environ, config.Prefix+"AMQP_URL_FILE="+file)
	c, err := config.Load(environ)
	if err != nil {
		problems = append(problems, fmt.Sprintf("ConfigMap %s: config.Load: %v", cm.Name, err))
	}
	for _, w := range c.Warnings {
		problems = append(problems, fmt.Sprintf("ConfigMap %s: %s", cm.Name, w))
	}
	return c, problems
}

// PodInput is what CheckPod needs besides the Deployment.
type PodInput struct {
	Layout    Layout
	ConfigMap *corev1.ConfigMap
	// Secret holding the broker URL, or nil when the kustomization leaves
	// it to be created out of band (the base).
	Secret *corev1.Secret
	// Config is what config.Load made of the ConfigMap.
	Config config.Config
	// Deployable is false for a base that leaves the image to overlays.
	Deployable bool
}

// CheckPod checks the Deployment's pod template against what rebound and
// its documentation promise: the layout, the security context, probes on
// the right paths and port, configuration and the broker URL file, resources
// and the termination grace period. It returns one line per problem.
func CheckPod(d *appsv1.Deployment, in PodInput) []string {
	p := &problems{prefix: "Deployment " + d.Name + ": "}
	spec := &d.Spec.Template.Spec
	c := findRebound(p, spec, in.Layout)
	if c == nil {
		return p.list
	}
	if in.Deployable {
		checkImage(p, c.Image)
	}
	checkSecurity(p, spec, c)
	port := checkPorts(p, c, in.Config.HTTPAddr)
	checkProbes(p, c, port, in.Layout)
	checkEnv(p, spec, c, in)
	checkResources(p, c)
	grace := 30 * time.Second // Kubernetes' default
	if spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	}
	if grace <= in.Config.ShutdownGrace {
		p.add("terminationGracePeriodSeconds %s leaves rebound no time beyond REBOUND_SHUTDOWN_GRACE %s, let alone the app's drain", grace, in.Config.ShutdownGrace)
	}
	for _, ctr := range slices.Concat(spec.InitContainers, spec.Containers) {
		checkRestricted(p, spec, &ctr)
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		p.add("pod shares host namespaces")
	}
	if in.Layout == Standalone {
		checkSpread(p, d)
	}
	return p.list
}

// checkSpread checks that the standalone Deployment runs at least two
// replicas and spreads them over nodes, so that one node's loss or drain
// never takes every consumer of the inbox.
func checkSpread(p *problems, d *appsv1.Deployment) {
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		p.add("fewer than 2 replicas: a node drain or a rollout would stop every consumer of the inbox")
	}
	for _, tsc := range d.Spec.Template.Spec.TopologySpreadConstraints {
		if tsc.TopologyKey != "kubernetes.io/hostname" || tsc.LabelSelector == nil {
			continue
		}
		selector, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector)
		if err == nil && !selector.Empty() && selector.Matches(labels.Set(d.Spec.Template.Labels)) {
			return
		}
	}
	p.add("no topologySpreadConstraints over kubernetes.io/hostname selecting its own pods: both replicas may land on one node")
}

type problems struct {
	prefix string
	list   []string
}

func (p *problems) add(format string, args ...any) {
	p.list = append(p.list, p.prefix+fmt.Sprintf(format, args...))
}

func findRebound(p *problems, spec *corev1.PodSpec, layout Layout) *corev1.Container {
	inInit := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == ContainerName })
	inMain := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == ContainerName })
	if inInit >= 0 && inMain >= 0 && layout != Standalone { // Standalone's own check names it
		p.add("%q is both an init container and a container", ContainerName)
	}
	switch layout {
	case NativeSidecar:
		if inInit < 0 {
			p.add("no init container %q (native sidecar layout)", ContainerName)
			return nil
		}
		c := &spec.InitContainers[inInit]
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			p.add("init container %q needs restartPolicy: Always to be a native sidecar; without it the app never starts", ContainerName)
		}
		if len(spec.Containers) == 0 {
			p.add("no application container")
		}
		return c
	case Standalone:
		if inMain < 0 || inInit >= 0 || len(spec.Containers) != 1 {
			p.add("want %q as the one container of its pod, and no init container (standalone layout)", ContainerName)
			return nil
		}
		c := &spec.Containers[inMain]
		if c.RestartPolicy != nil {
			p.add("container %q has restartPolicy, which only init containers may carry", ContainerName)
		}
		return c
	default:
		if inMain < 0 {
			p.add("no container %q (two-container layout)", ContainerName)
			return nil
		}
		c := &spec.Containers[inMain]
		if c.RestartPolicy != nil {
			p.add("container %q has restartPolicy, which clusters without native sidecars reject", ContainerName)
		}
		if len(spec.Containers) < 2 {
			p.add("no application container beside %q", ContainerName)
		}
		return c
	}
}

func checkImage(p *problems, image string) {
	name, tag := image, ""
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		name, tag = image[:i], image[i+1:]
	}
	switch {
	case strings.Contains(image, "@sha256:"):
	case tag == "" || tag == "latest":
		p.add("image %q: pin a tag or digest", image)
	case !strings.Contains(name, "/"):
		p.add("image %q: name the registry the image was pushed to", image)
	}
}

// effective is a container's security settings with the pod's defaults
// applied, as the kubelet applies them.
type effective struct {
	runAsNonRoot          bool
	runAsUser, runAsGroup *int64
	runtimeDefaultSeccomp bool
	readOnlyRoot          bool
	noPrivilegeEscalation bool
	dropsAll, privileged  bool
	addsCapabilities      bool
}

func effectiveSecurity(spec *corev1.PodSpec, c *corev1.Container) effective {
	var e effective
	if ps := spec.SecurityContext; ps != nil {
		e.runAsNonRoot = ps.RunAsNonRoot != nil && *ps.RunAsNonRoot
		e.runAsUser, e.runAsGroup = ps.RunAsUser, ps.RunAsGroup
		e.runtimeDefaultSeccomp = ps.SeccompProfile != nil && ps.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
	}
	sc := c.SecurityContext
	if sc == nil {
		return e
	}
	if sc.RunAsNonRoot != nil {
		e.runAsNonRoot = *sc.RunAsNonRoot
	}
	if sc.RunAsUser != nil {
		e.runAsUser = sc.RunAsUser
	}
	if sc.RunAsGroup != nil {
		e.runAsGroup = sc.RunAsGroup
	}
	if sc.SeccompProfile != nil {
		e.runtimeDefaultSeccomp = sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
	}
	e.readOnlyRoot = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	e.noPrivilegeEscalation = sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
	e.privileged = sc.Privileged != nil && *sc.Privileged
	if sc.Capabilities != nil {
		e.dropsAll = slices.Contains(sc.Capabilities.Drop, "ALL")
		e.addsCapabilities = len(sc.Capabilities.Add) > 0
	}
	return e
}

func checkSecurity(p *problems, spec *corev1.PodSpec, c *corev1.Container) {
	e := effectiveSecurity(spec, c)
	if !e.readOnlyRoot {
		p.add("%s: readOnlyRootFilesystem must be true", c.Name)
	}
	if e.runAsUser == nil || *e.runAsUser != ImageUID {
		p.add("%s: runAsUser must be %d, the image's user", c.Name, ImageUID)
	}
	if e.runAsGroup == nil || *e.runAsGroup != ImageUID {
		p.add("%s: runAsGroup must be %d, the image's group", c.Name, ImageUID)
	}
	if e.addsCapabilities {
		p.add("%s: adds capabilities; rebound needs none", c.Name)
	}
}

// checkRestricted checks what the Pod Security Standards' restricted
// profile requires of every container, so the example runs in a namespace
// that enforces it.
func checkRestricted(p *problems, spec *corev1.PodSpec, c *corev1.Container) {
	e := effectiveSecurity(spec, c)
	if !e.runAsNonRoot {
		p.add("%s: runAsNonRoot must be true", c.Name)
	}
	if e.runAsUser != nil && *e.runAsUser == 0 {
		p.add("%s: runs as root", c.Name)
	}
	if !e.noPrivilegeEscalation {
		p.add("%s: allowPrivilegeEscalation must be false", c.Name)
	}
	if !e.dropsAll {
		p.add("%s: capabilities must drop ALL", c.Name)
	}
	if !e.runtimeDefaultSeccomp {
		p.add("%s: seccompProfile must be RuntimeDefault", c.Name)
	}
	if e.privileged {
		p.add("%s: privileged", c.Name)
	}
}

// checkPorts returns rebound's HTTP container port, which must be the port
// of REBOUND_HTTP_ADDR.
func checkPorts(p *problems, c *corev1.Container, httpAddr string) *corev1.ContainerPort {
	_, portText, err := net.SplitHostPort(httpAddr)
	want, convErr := strconv.Atoi(portText)
	if err != nil || convErr != nil {
		p.add("REBOUND_HTTP_ADDR %q has no numeric port", httpAddr)
		return nil
	}
	var found *corev1.ContainerPort
	for i := range c.Ports {
		cp := &c.Ports[i]
		if cp.Name != "" {
			for _, msg := range validation.IsValidPortName(cp.Name) {
				p.add("%s: port name %q: %s", c.Name, cp.Name, msg)
			}
		}
		if int(cp.ContainerPort) == want {
			found = cp
		}
	}
	if found == nil {
		p.add("%s: no containerPort %d (REBOUND_HTTP_ADDR=%s)", c.Name, want, httpAddr)
		return nil
	}
	if found.Name == "" {
		p.add("%s: port %d needs a name for probes and the PodMonitor", c.Name, want)
	}
	return found
}

func checkProbes(p *problems, c *corev1.Container, port *corev1.ContainerPort, layout Layout) {
	probe := func(kind string, pr *corev1.Probe, paths ...string) {
		if pr == nil {
			p.add("%s: no %s probe", c.Name, kind)
			return
		}
		if pr.HTTPGet == nil {
			p.add("%s: %s probe must be an HTTP GET", c.Name, kind)
			return
		}
		if !slices.Contains(paths, pr.HTTPGet.Path) {
			p.add("%s: %s probe path %q, want %s", c.Name, kind, pr.HTTPGet.Path, strings.Join(paths, " or "))
		}
		if port != nil && !portIs(pr.HTTPGet.Port, port) {
			p.add("%s: %s probe port %s is not the HTTP port %s/%d", c.Name, kind, pr.HTTPGet.Port.String(), port.Name, port.ContainerPort)
		}
	}
	// Beside an application, rebound's readiness and startup are the pod's:
	// neither may wait on the broker, or a broker outage keeps every
	// service from starting and takes every pod out of its Service. Alone
	// (standalone), it is ready when it consumes.
	ready := "/readyz"
	if layout != Standalone {
		ready = "/healthz"
	}
	probe("readiness", c.ReadinessProbe, ready)
	probe("liveness", c.LivenessProbe, "/healthz")
	if c.StartupProbe != nil {
		if layout == Standalone {
			probe("startup", c.StartupProbe, "/readyz", "/healthz")
		} else {
			probe("startup", c.StartupProbe, "/healthz")
		}
	} else if layout == NativeSidecar {
		p.add("%s: no startup probe: the app would start before rebound serves its probes", c.Name)
	}
	if lp := c.LivenessProbe; lp != nil {
		// A broker outage must never restart rebound: /healthz ignores the
		// broker, and a slow scrape or GC pause must not count either.
		if window := probeWindow(lp); window < 30*time.Second {
			p.add("%s: liveness probe gives up after %s; allow at least 30s", c.Name, window)
		}
		if lp.TimeoutSeconds < 2 {
			p.add("%s: liveness probe timeoutSeconds %d; allow at least 2", c.Name, lp.TimeoutSeconds)
		}
	}
}

// probeWindow is how long a probe may fail before the kubelet acts.
func probeWindow(pr *corev1.Probe) time.Duration {
	period, failures := pr.PeriodSeconds, pr.FailureThreshold
	if period == 0 {
		period = 10
	}
	if failures == 0 {
		failures = 3
	}
	return time.Duration(period*failures) * time.Second
}

func portIs(ref intstr.IntOrString, port *corev1.ContainerPort) bool {
	if ref.Type == intstr.String {
		return ref.StrVal == port.Name
	}
	return ref.IntVal == port.ContainerPort
}

// checkEnv checks envFrom and the broker URL file: REBOUND_AMQP_URL_FILE
// names a file in a read-only mount of the Secret, readable by rebound's
// user, and no broker URL sits in plain environment variables.
func checkEnv(p *problems, spec *corev1.PodSpec, c *corev1.Container, in PodInput) {
	fromCM := slices.ContainsFunc(c.EnvFrom, func(s corev1.EnvFromSource) bool {
		return s.ConfigMapRef != nil && s.ConfigMapRef.Name == in.ConfigMap.Name
	})
	if !fromCM {
		p.add("%s: envFrom does not load ConfigMap %s", c.Name, in.ConfigMap.Name)
	}
	urlFile, podName := "", false
	for _, e := range c.Env {
		switch e.Name {
		case "POD_NAME":
			podName = e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
		case config.Prefix + "AMQP_URL":
			p.add("%s: REBOUND_AMQP_URL in env puts the password in the pod spec; use REBOUND_AMQP_URL_FILE", c.Name)
		case config.Prefix + "AMQP_URL_FILE":
			urlFile = e.Value
		case "GOMEMLIMIT":
			// rebound takes three quarters of the container's memory
			// limit itself (internal/memlimit): a literal beside the
			// limit is a second place to change, which drifts.
			p.add("%s: GOMEMLIMIT=%s set: rebound sets it from the memory limit itself; state only resources.limits.memory", c.Name, e.Value)
		}
	}
	if !podName {
		p.add("%s: POD_NAME is not the pod's metadata.name (downward API): the broker would not show which pod a connection is", c.Name)
	}
	if urlFile == "" {
		p.add("%s: REBOUND_AMQP_URL_FILE not set", c.Name)
		return
	}
	var mount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		m := &c.VolumeMounts[i]
		if strings.HasPrefix(urlFile, strings.TrimSuffix(m.MountPath, "/")+"/") {
			mount = m
		}
	}
	if mount == nil {
		p.add("%s: REBOUND_AMQP_URL_FILE %s is under no volume mount", c.Name, urlFile)
		return
	}
	if !mount.ReadOnly {
		p.add("%s: mount %s of the broker URL must be readOnly", c.Name, mount.MountPath)
	}
	vi := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == mount.Name })
	if vi < 0 || spec.Volumes[vi].Secret == nil {
		p.add("%s: volume %s holding the broker URL is not a Secret volume", c.Name, mount.Name)
		return
	}
	sv := spec.Volumes[vi].Secret
	file := strings.TrimPrefix(urlFile, strings.TrimSuffix(mount.MountPath, "/")+"/")
	key, mode := file, sv.DefaultMode
	if len(sv.Items) > 0 {
		ii := slices.IndexFunc(sv.Items, func(it corev1.KeyToPath) bool { return it.Path == file })
		if ii < 0 {
			p.add("%s: Secret volume %s projects no item to %s", c.Name, mount.Name, file)
			return
		}
		key = sv.Items[ii].Key
		if sv.Items[ii].Mode != nil {
			mode = sv.Items[ii].Mode
		}
	}
	if in.Secret != nil {
		if in.Secret.Name != sv.SecretName {
			p.add("%s: volume %s mounts Secret %s, the kustomization makes %s", c.Name, mount.Name, sv.SecretName, in.Secret.Name)
		}
		_, inData := in.Secret.Data[key]
		_, inString := in.Secret.StringData[key]
		if !inData && !inString {
			p.add("Secret %s has no key %s", in.Secret.Name, key)
		}
	}
	if !readable(spec, c, mode) {
		p.add("%s: the broker URL file (mode %#o) is not readable by the container's user", c.Name, modeOr(mode))
	}
}

func modeOr(mode *int32) int32 {
	if mode == nil {
		return 0o644 // Kubernetes' default for Secret volumes
	}
	return *mode
}

// readable tells whether the container's user can read a Secret file of
// this mode: the kubelet makes such files owned by root, group fsGroup.
func readable(spec *corev1.PodSpec, c *corev1.Container, mode *int32) bool {
	m := modeOr(mode)
	e := effectiveSecurity(spec, c)
	switch {
	case m&0o004 != 0:
		return true
	case m&0o040 != 0 && spec.SecurityContext != nil && spec.SecurityContext.FSGroup != nil:
		return true
	case m&0o400 != 0 && e.runAsUser != nil && *e.runAsUser == 0:
		return true
	}
	return false
}

func checkResources(p *problems, c *corev1.Container) {
	r := c.Resources
	if _, ok := r.Requests[corev1.ResourceCPU]; !ok {
		p.add("%s: no CPU request", c.Name)
	}
	if _, ok := r.Requests[corev1.ResourceMemory]; !ok {
		p.add("%s: no memory request", c.Name)
	}
	if _, ok := r.Limits[corev1.ResourceMemory]; !ok {
		p.add("%s: no memory limit", c.Name)
	}
	if _, ok := r.Limits[corev1.ResourceCPU]; ok {
		p.add("%s: CPU limit set; throttling only delays confirms and acks", c.Name)
	}
}
