package netconf

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// Limits of the keys. Each says where it comes from; the error for a key
// quotes accepted[key], so a user reads the rule, not just the refusal.
const (
	minMTU   = podnet.MinMTU
	minMTUv6 = podnet.MinMTUv6
	maxMTU   = podnet.MaxMTU
	// The smallest GSO cap that still holds one frame of the smallest
	// MTU with its Ethernet header; and the kernel's GSO_MAX_SIZE without
	// BIG TCP, above which nothing is capped (the stack never builds a
	// larger burst).
	minGSOMaxSize = minMTU + 14
	maxGSOMaxSize = 65536
	// The kernel's GSO_MAX_SEGS: gso_max_segs is a 16-bit count.
	maxGSOMaxSegs = 65535
	// maxQueueLen bounds the legs' FIFO queues: every queued packet may
	// hold a 64 KiB GSO burst, so 65536 of them is already 4 GiB per leg,
	// far past the default (stackconfig.DefaultQueueLen).
	maxQueueLen = 65536
	// maxStackThreads bounds stackThreads: more than a node's CPUs only
	// adds idle threads.
	maxStackThreads = 1024
	// minDuration: an idle UDP flow expired, or a stack given up on, in
	// less than a second is a unit mistake ("30" meant as seconds is
	// refused by the parser; "30ms" is caught here).
	minDuration = time.Second
	// maxSocketPath is the longest path a unix socket can bind: sun_path
	// is 108 bytes with the terminating NUL. A stack's control socket is
	// runDir/<state key>.sock, so runDir must leave room for that name.
	maxSocketPath = 107
	maxNodeName   = 253
)

// socketName is the length of "/<key>.sock" that runDir must leave room for.
var socketName = len("/" + state.Key("", "") + ".sock")

// maxRunDir is the longest runDir whose control sockets can be bound.
var maxRunDir = maxSocketPath - socketName

// accepted says what each key takes; errors about a key end with it.
var accepted = map[string]string{
	"name":         "a non-empty string (the CNI spec requires it; a conflist passes its own to every plugin)",
	"mtu":          fmt.Sprintf("%d..%d (%d..%d when IPv6 is configured); absent or 0: 1500", minMTU, maxMTU, minMTUv6, maxMTU),
	"gso":          "one of auto, hardware, software, off; absent: auto",
	"ipam":         `an object naming the IPAM plugin, e.g. {"type": "host-local", ...}; absent: chained after the plugin of prevResult`,
	"dns":          `an object like {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}`,
	"args":         "an object",
	"type":         "a string",
	"capabilities": "an object of true or false",
	"prevResult":   "an object: the result of the previous plugin in the conflist",
	"cniVersion":   "a version string like \"1.1.0\"",
	"gsoMaxSize": fmt.Sprintf("a byte count %d..%d; absent or 0: the link's gso_max_size",
		minGSOMaxSize, maxGSOMaxSize),
	"gsoMaxSegs":         fmt.Sprintf("a segment count 1..%d; absent or 0: the link's gso_max_segs", maxGSOMaxSegs),
	"gro":                "true or false; absent: true",
	"rxChecksumOffload":  "true or false; absent: true",
	"tunOffload":         "true or false (accepted and ignored since the applications' traffic left the TUN)",
	"podLinkOffloadsOff": "true or false; absent: false",
	"networkPolicy":      "true or false; absent: false",
	"tunName": fmt.Sprintf(`an interface name: 1..15 bytes, no "/", ":", "%%" or white space, not ".", ".." or "lo"; absent: %s`,
		stackconfig.DefaultTUNName),
	"tunMTU":         fmt.Sprintf("%d..%d; absent or 0: %d", minMTUv6, maxMTU, stackconfig.DefaultTUNMTU),
	"wireQueueLen":   fmt.Sprintf("a packet count 1..%d, -1 for no queue; absent or 0: %d", maxQueueLen, stackconfig.DefaultQueueLen),
	"appQueueLen":    fmt.Sprintf("a packet count 1..%d or -1 (accepted and ignored since the applications' traffic left the TUN)", maxQueueLen),
	"stackThreads":   fmt.Sprintf("a thread count 1..%d; absent or 0: %d, up to one per CPU (at most %d) under bulk traffic", maxStackThreads, stackconfig.DefaultThreads, stackconfig.MaxAdaptiveThreads),
	"maxTCP":         "a non-negative count of relayed TCP connections; absent or 0: the relay's default",
	"maxUDP":         "a non-negative count of relayed UDP flows; absent or 0: the relay's default",
	"busyPoll":       fmt.Sprintf(`"auto", or a duration like "50us", at most %s; "0s": off`, stackconfig.MaxBusyPoll),
	"socketRedirect": fmt.Sprintf("one of %s; absent: %s, and a pod's annotation may turn it on", socketRedirectValues, SocketRedirectOff),
	"bpfDir":         "an absolute path in a bpffs; absent: " + DefaultBPFDir,
	"udpIdle":        fmt.Sprintf(`a positive duration like "30s", at least %s; absent: the relay's default`, minDuration),
	"readyTimeout":   fmt.Sprintf(`a positive duration like "30s", at least %s; absent: %s`, minDuration, DefaultReadyTimeout),
	"stateDir":       "an absolute path; absent: " + DefaultStateDir,
	"logDir":         "an absolute path; absent: " + DefaultLogDir,
	"runDir": fmt.Sprintf("an absolute path of at most %d bytes (the stack's control socket, runDir + %d bytes, must fit in %d); absent: %s",
		maxRunDir, socketName, maxSocketPath, DefaultRunDir),
	"netnsDir":      fmt.Sprintf("an absolute path; absent: %s", DefaultNetnsDir),
	"mountNS":       fmt.Sprintf("an absolute path to a mount namespace; absent: %s", DefaultMountNS),
	"kubeconfig":    "an absolute path to a kubeconfig file; absent: the API server is not used",
	"nodeName":      fmt.Sprintf(`a Kubernetes node name (lower-case letters, digits, "-" and ".", at most %d bytes); absent: the host name`, maxNodeName),
	"stackCgroup":   fmt.Sprintf("one of %s (the stack is charged to its pod's cgroup), %s (to cni-usernet's cgroup under the node's kubepods tree); absent: %s", StackCgroupPod, StackCgroupNode, StackCgroupPod),
	"runtimeConfig": `an object, e.g. {"io.kubernetes.cri.pod-annotations": {...}, "cgroupPath": "..."}`,
	"runtimeConfig.io.kubernetes.cri.pod-annotations": "an object of strings (the pod's annotations)",
	"runtimeConfig.cgroupPath":                        "a string",
}

// badValue is the error for a key whose value was decoded but is not
// accepted; got is the value as the user wrote it.
func badValue(key, got string) error {
	return fmt.Errorf("%q: got %s, want %s", key, got, accepted[key])
}

func (c *NetConf) validate(data []byte) error {
	if c.Name == "" {
		return fmt.Errorf(`"name" is missing or empty, want %s`, accepted["name"])
	}
	if c.MTU == 0 {
		c.MTU = 1500
	}
	if c.MTU < minMTU || c.MTU > maxMTU {
		return badValue("mtu", strconv.Itoa(c.MTU))
	}
	if c.GSO == "" {
		c.GSO = string(offload.ModeAuto)
	}
	if _, err := offload.ParseMode(c.GSO); err != nil {
		return badValue("gso", strconv.Quote(c.GSO))
	}
	if c.GSOMaxSize != 0 && (c.GSOMaxSize < minGSOMaxSize || c.GSOMaxSize > maxGSOMaxSize) {
		return badValue("gsoMaxSize", fmt.Sprint(c.GSOMaxSize))
	}
	if c.GSOMaxSegs > maxGSOMaxSegs {
		return badValue("gsoMaxSegs", fmt.Sprint(c.GSOMaxSegs))
	}
	if c.TUNName == "" {
		c.TUNName = stackconfig.DefaultTUNName
	}
	// The stack would fail on a name the kernel refuses only after ADD
	// had leased addresses and made the veth.
	if !ValidIfName(c.TUNName) || c.TUNName == "lo" {
		return badValue("tunName", strconv.Quote(c.TUNName))
	}
	if c.TUNMTU != 0 && (c.TUNMTU < minMTUv6 || c.TUNMTU > maxMTU) {
		return badValue("tunMTU", fmt.Sprint(c.TUNMTU))
	}
	for _, q := range []struct {
		key string
		n   int
	}{{"wireQueueLen", c.WireQueueLen}, {"appQueueLen", c.AppQueueLen}} {
		if q.n < -1 || q.n > maxQueueLen {
			return badValue(q.key, strconv.Itoa(q.n))
		}
	}
	if c.StackThreads < 0 || c.StackThreads > maxStackThreads {
		return badValue("stackThreads", strconv.Itoa(c.StackThreads))
	}
	for _, m := range []struct {
		key string
		n   int
	}{{"maxTCP", c.MaxTCP}, {"maxUDP", c.MaxUDP}} {
		if m.n < 0 {
			return badValue(m.key, strconv.Itoa(m.n))
		}
	}
	var err error
	if c.udpIdle, err = parseDuration("udpIdle", c.UDPIdle, 0); err != nil {
		return err
	}
	c.busyPollAuto = true
	if c.BusyPoll != "" {
		d, auto, ok := parseBusyPoll(c.BusyPoll)
		if !ok {
			return badValue("busyPoll", strconv.Quote(c.BusyPoll))
		}
		c.busyPoll, c.busyPollAuto = d, auto
	}
	if c.readyTimeout, err = parseDuration("readyTimeout", c.ReadyTimeout, DefaultReadyTimeout); err != nil {
		return err
	}
	for _, p := range []struct{ key, path string }{
		{"stateDir", c.StateDir}, {"logDir", c.LogDir}, {"runDir", c.RunDir}, {"netnsDir", c.NetnsDir}, {"mountNS", c.MountNS}, {"kubeconfig", c.Kubeconfig}, {"bpfDir", c.BPFDir},
	} {
		if p.path != "" && (!filepath.IsAbs(p.path) || strings.ContainsRune(p.path, 0)) {
			return badValue(p.key, strconv.Quote(p.path))
		}
	}
	if n := len(filepath.Clean(c.RunDir)); c.RunDir != "" && n > maxRunDir {
		return fmt.Errorf("%q: got %q, %d bytes long, want %s", "runDir", c.RunDir, n, accepted["runDir"])
	}
	if c.NodeName != "" && (len(c.NodeName) > maxNodeName || !nodeNameRE.MatchString(c.NodeName)) {
		return badValue("nodeName", strconv.Quote(c.NodeName))
	}
	if c.SocketRedirect != "" && !validSocketRedirect(c.SocketRedirect) {
		return badValue("socketRedirect", strconv.Quote(c.SocketRedirect))
	}
	if c.StackCgroup == "" {
		c.StackCgroup = StackCgroupPod
	}
	if c.StackCgroup != StackCgroupPod && c.StackCgroup != StackCgroupNode {
		return badValue("stackCgroup", strconv.Quote(c.StackCgroup))
	}
	if err := c.validateIPAM(data); err != nil {
		return err
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.LogDir == "" {
		c.LogDir = DefaultLogDir
	}
	if c.RunDir == "" {
		c.RunDir = DefaultRunDir
	}
	if c.NetnsDir == "" {
		c.NetnsDir = DefaultNetnsDir
	}
	if c.MountNS == "" {
		c.MountNS = DefaultMountNS
	}
	if c.BPFDir == "" {
		c.BPFDir = DefaultBPFDir
	}
	return nil
}

// nodeNameRE is Kubernetes' DNS-1123 subdomain, which Node names are.
var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// ValidIfName reports whether the kernel accepts name for a new link
// (dev_valid_name), and takes it literally: "%" would make TUNSETIFF pick
// a name of its own from the pattern, which the caller would not know.
func ValidIfName(name string) bool {
	if name == "" || len(name) > 15 || name == "." || name == ".." {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch name[i] {
		// The kernel's isspace() also counts 0xa0, byte by byte.
		case '/', ':', '%', 0, ' ', '\t', '\n', '\v', '\f', '\r', 0xa0:
			return false
		}
	}
	return true
}

// validateIPAM checks what ADD needs from "ipam" before it runs the
// plugin: a type that names a plugin binary in CNI_PATH, never a path out
// of it.
func (c *NetConf) validateIPAM(data []byte) error {
	var raw struct {
		IPAM json.RawMessage `json:"ipam"`
	}
	if err := json.Unmarshal(data, &raw); err != nil || len(raw.IPAM) == 0 || string(raw.IPAM) == "null" {
		return nil
	}
	t := c.IPAM.Type
	if t == "" || t == "." || t == ".." || strings.ContainsAny(t, "/\x00") {
		return badValue("ipam", truncate(string(raw.IPAM)))
	}
	return nil
}

// validateIPv6MTU refuses an MTU below IPv6's minimum when the pod gets an
// IPv6 address: from prevResult, or from a host-local or static IPAM
// section. Other IPAM plugins are not second-guessed.
func (c *NetConf) validateIPv6MTU(data []byte) error {
	if c.MTU >= minMTUv6 {
		return nil
	}
	var raw struct {
		IPAM struct {
			Subnet string `json:"subnet"`
			Ranges [][]struct {
				Subnet string `json:"subnet"`
			} `json:"ranges"`
			Addresses []struct {
				Address string `json:"address"`
			} `json:"addresses"`
		} `json:"ipam"`
	}
	// Best effort: an IPAM section of another shape is the IPAM plugin's
	// to judge.
	_ = json.Unmarshal(data, &raw)
	prefixes := []string{raw.IPAM.Subnet}
	for _, set := range raw.IPAM.Ranges {
		for _, r := range set {
			prefixes = append(prefixes, r.Subnet)
		}
	}
	for _, a := range raw.IPAM.Addresses {
		prefixes = append(prefixes, a.Address)
	}
	if c.PrevResult != nil {
		if prev, err := current.NewResultFromResult(c.PrevResult); err == nil {
			for _, ipc := range prev.IPs {
				prefixes = append(prefixes, ipc.Address.String())
			}
		}
	}
	for _, s := range prefixes {
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is6() && !p.Addr().Is4In6() {
			return fmt.Errorf(`"mtu": got %d, want %d..%d: the pod gets IPv6 (%s), whose minimum MTU is %d`,
				c.MTU, minMTUv6, maxMTU, s, minMTUv6)
		}
	}
	return nil
}

// parseBusyPoll reads busy polling: BusyPollAuto, or a window, a
// duration 0..MaxBusyPoll (0: off).
func parseBusyPoll(s string) (window time.Duration, auto, ok bool) {
	if s == BusyPollAuto {
		return 0, true, true
	}
	d, err := time.ParseDuration(s)
	return d, false, err == nil && d >= 0 && d <= stackconfig.MaxBusyPoll
}

func parseDuration(key, s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < minDuration {
		return 0, badValue(key, strconv.Quote(s))
	}
	return d, nil
}

// decodeError rewrites what encoding/json says about a value of the wrong
// type ("cannot unmarshal string into Go struct field NetConf.PluginConf.mtu
// of type int") into the key, the value as written and what the key
// accepts; a syntax error gets its byte offset.
func decodeError(data []byte, err error) error {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Errorf("not valid JSON at byte %d: %w", syn.Offset, err)
	}
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return err
	}
	path := strings.TrimPrefix(te.Field, "PluginConf.")
	if path == "" {
		return fmt.Errorf("got a JSON %s, want an object", te.Value)
	}
	got := "a JSON " + te.Value
	var top map[string]json.RawMessage
	if json.Unmarshal(data, &top) == nil {
		if v, ok := top[path]; ok {
			got = fmt.Sprintf("%s (%s)", truncate(string(v)), jsonKind(v))
		}
	}
	want, ok := accepted[path]
	if !ok {
		want = describe(te.Type)
	}
	return fmt.Errorf("%q: got %s, want %s", path, got, want)
}

// truncate keeps a quoted value short enough to read in a pod's events.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("...(%d bytes)", len(s))
}

func jsonKind(v json.RawMessage) string {
	switch s := strings.TrimSpace(string(v)); {
	case s == "null":
		return "null"
	case s == "true" || s == "false":
		return "a boolean"
	case strings.HasPrefix(s, `"`):
		return "a string"
	case strings.HasPrefix(s, "{"):
		return "an object"
	case strings.HasPrefix(s, "["):
		return "an array"
	default:
		return "a number"
	}
}

// describe names the JSON a Go type takes, for keys without an entry in
// accepted (nested ones such as "dns.nameservers").
func describe(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative whole number"
	case reflect.Slice, reflect.Array:
		return "an array of " + strings.TrimPrefix(strings.TrimPrefix(describe(t.Elem()), "a "), "an ") + "s"
	case reflect.Pointer:
		return describe(t.Elem())
	default:
		return "an object"
	}
}
