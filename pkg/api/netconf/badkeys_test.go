package netconf_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
)

// badKey is one wrong value for one key: the error must name the key
// (quoted, as in the file), show the value as the user wrote it, and say
// what the key accepts.
type badKey struct {
	key   string
	value any
	// got is how the value must appear in the error; want a distinctive
	// part of what the key accepts.
	got, want string
}

// wrongTypes gives every key of NetConf a value of the wrong JSON type.
var wrongTypes = []badKey{
	{"name", 7, "7 (a number)", "non-empty string"},
	{"mtu", "big", `"big" (a string)`, "576..65535"},
	{"mtu", 1500.5, "1500.5 (a number)", "576..65535"},
	{"gso", true, "true (a boolean)", "auto, hardware, software, off"},
	{"gsoMaxSize", -1, "-1 (a number)", "590..65536"},
	{"gsoMaxSize", "64k", `"64k" (a string)`, "590..65536"},
	{"gsoMaxSegs", 1e10, "10000000000 (a number)", "1..65535"},
	{"gro", "yes", `"yes" (a string)`, "true or false"},
	{"rxChecksumOffload", 1, "1 (a number)", "true or false"},
	{"tunName", []any{"tun0"}, `["tun0"] (an array)`, "interface name"},
	{"tunOffload", "off", `"off" (a string)`, "true or false"},
	{"tunMTU", -1, "-1 (a number)", "1280..65535"},
	{"wireQueueLen", "1k", `"1k" (a string)`, "-1 for no queue"},
	{"appQueueLen", 2.5, "2.5 (a number)", "accepted and ignored"},
	{"stackThreads", "2", `"2" (a string)`, "thread count 1..1024"},
	{"maxTCP", "many", `"many" (a string)`, "non-negative count"},
	{"maxUDP", false, "false (a boolean)", "non-negative count"},
	{"udpIdle", 30, "30 (a number)", `duration like "30s"`},
	{"busyPoll", 50, "50 (a number)", `duration like "50us"`},
	{"podLinkOffloadsOff", "true", `"true" (a string)`, "true or false"},
	{"networkPolicy", "yes", `"yes" (a string)`, "true or false"},
	{"stackCgroup", true, "true (a boolean)", "one of pod (the stack is charged to its pod's cgroup), node"},
	{"stateDir", map[string]any{}, "{} (an object)", "absolute path"},
	{"logDir", 0, "0 (a number)", "absolute path"},
	{"runDir", []any{}, "[] (an array)", "absolute path"},
	{"readyTimeout", 10, "10 (a number)", `duration like "30s"`},
	{"kubeconfig", true, "true (a boolean)", "absolute path"},
	{"nodeName", 1, "1 (a number)", "Kubernetes node name"},
	{"ipam", "host-local", `"host-local" (a string)`, `{"type": "host-local", ...}`},
	{"dns", []any{"10.96.0.10"}, `["10.96.0.10"] (an array)`, `{"nameservers"`},
	{"runtimeConfig", []any{}, "[] (an array)", "io.kubernetes.cri.pod-annotations"},
	{"capabilities", "all", `"all" (a string)`, "an object of true or false"},
}

// badValues gives every key that has a range or a syntax a value outside it.
var badValues = []badKey{
	{"name", "", `"name" is missing or empty`, "non-empty string"},
	{"mtu", 575, "575", "576..65535"},
	{"mtu", 65536, "65536", "576..65535"},
	{"mtu", -1500, "-1500", "576..65535"},
	{"gso", "on", `"on"`, "auto, hardware, software, off"},
	{"gso", "HARDWARE", `"HARDWARE"`, "auto, hardware, software, off"},
	{"gsoMaxSize", 589, "589", "590..65536"},
	{"gsoMaxSize", 65537, "65537", "590..65536"},
	{"gsoMaxSegs", 65536, "65536", "1..65535"},
	{"tunName", "", `"usernet0"`, ""}, // empty is the default, not an error: see TestBadKeysAcceptEdges
	{"tunName", "lo", `"lo"`, "interface name"},
	{"tunName", "tun%d", `"tun%d"`, `"%"`},
	{"tunName", "tun\x00", `"tun\x00"`, "interface name"},
	{"tunName", "t\u00a0n", `"t\u00a0n"`, "white space"},
	{"tunName", "tun\t0", `"tun\t0"`, "white space"},
	{"tunName", ".", `"."`, `not ".", ".."`},
	{"tunName", "a23456789012345x", `"a23456789012345x"`, "1..15 bytes"},
	{"tunMTU", 1279, "1279", "1280..65535"},
	{"tunMTU", 65536, "65536", "1280..65535"},
	{"wireQueueLen", -2, "-2", "-1 for no queue"},
	{"wireQueueLen", 65537, "65537", "1..65536"},
	{"appQueueLen", -100, "-100", "accepted and ignored"},
	{"appQueueLen", 1 << 30, "1073741824", "1..65536"},
	{"stackThreads", -1, "-1", "absent or 0: 1"},
	{"stackThreads", 1025, "1025", "1..1024"},
	{"maxTCP", -1, "-1", "non-negative count of relayed TCP connections"},
	{"maxUDP", -7, "-7", "non-negative count of relayed UDP flows"},
	{"udpIdle", "30", `"30"`, `positive duration like "30s"`},
	{"busyPoll", "50", `"50"`, `duration like "50us", at most 10ms`},
	{"busyPoll", "-50us", `"-50us"`, `at most 10ms`},
	{"busyPoll", "11ms", `"11ms"`, `at most 10ms`},
	{"udpIdle", "-1m", `"-1m"`, "positive duration"},
	{"udpIdle", "30ms", `"30ms"`, "at least 1s"},
	{"readyTimeout", "0s", `"0s"`, "positive duration"},
	{"readyTimeout", "soon", `"soon"`, "positive duration"},
	{"readyTimeout", "500ms", `"500ms"`, "at least 1s"},
	{"stateDir", "var/lib/x", `"var/lib/x"`, "absolute path"},
	{"stateDir", "/var/lib/x\x00y", `"/var/lib/x\x00y"`, "absolute path"},
	{"logDir", "~/log", `"~/log"`, "absolute path"},
	{"runDir", "./run", `"./run"`, "absolute path"},
	{"runDir", "/" + strings.Repeat("r", 85), `"/` + strings.Repeat("r", 85) + `", 86 bytes long`, "at most 85 bytes"},
	{"kubeconfig", "kubeconfig.yaml", `"kubeconfig.yaml"`, "absolute path"},
	{"netnsDir", "netns", `"netns"`, "absolute path"},
	{"nodeName", "Node_1", `"Node_1"`, "Kubernetes node name"},
	{"nodeName", "node-", `"node-"`, "lower-case letters"},
	{"nodeName", strings.Repeat("n", 254), `"` + strings.Repeat("n", 254) + `"`, "at most 253 bytes"},
	{"stackCgroup", "Pod", `"Pod"`, "one of pod"},
	{"stackCgroup", "runtime", `"runtime"`, "absent: pod"},
	{"ipam", map[string]any{}, "{}", `naming the IPAM plugin`},
	{"ipam", map[string]any{"type": "../../bin/sh"}, `{"type":"../../bin/sh"}`, `naming the IPAM plugin`},
}

func TestBadKeys(t *testing.T) {
	for _, set := range []struct {
		name  string
		cases []badKey
	}{{"wrong type", wrongTypes}, {"bad value", badValues}} {
		for _, c := range set.cases {
			if c.want == "" {
				continue
			}
			t.Run(set.name+"/"+c.key+"="+truncated(c.value), func(t *testing.T) {
				data := conf(t, map[string]any{c.key: c.value})
				got, err := netconf.Parse(data)
				if err == nil {
					t.Fatalf("Parse(%s): got %+v, want an error", data, got)
				}
				msg := err.Error()
				parts := []string{c.got, c.want}
				if c.key != "name" || c.value != "" {
					parts = append(parts, `"`+c.key+`": got `)
				}
				for _, p := range parts {
					if !strings.Contains(msg, p) {
						t.Errorf("error %q: got no %q in it, want it named", msg, p)
					}
				}
			})
		}
	}
}

func truncated(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 20 {
		b = append(b[:20], "..."...)
	}
	return string(b)
}

// TestBadKeysAcceptEdges checks that the limits are where the errors say:
// each edge value is accepted.
func TestBadKeysAcceptEdges(t *testing.T) {
	for _, c := range []map[string]any{
		{"mtu": 576}, {"mtu": 65535}, {"mtu": 0},
		{"mtu": 1280, "ipam": map[string]any{"type": "host-local", "ranges": []any{[]any{map[string]any{"subnet": "fd00::/64"}}}}},
		{"mtu": 576, "ipam": map[string]any{"type": "host-local", "ranges": []any{[]any{map[string]any{"subnet": "10.0.0.0/24"}}}}},
		{"mtu": 576, "ipam": map[string]any{"type": "whereabouts", "range": "fd00::/64"}}, // not ours to read
		{"gsoMaxSize": 590}, {"gsoMaxSize": 65536}, {"gsoMaxSize": 0},
		{"gsoMaxSegs": 1}, {"gsoMaxSegs": 65535},
		{"tunName": ""}, {"tunName": "a23456789012345"}, {"tunName": "tün0"}, {"tunName": "..."},
		{"tunMTU": 1280}, {"tunMTU": 65535},
		{"wireQueueLen": -1, "appQueueLen": 65536}, {"wireQueueLen": 1, "appQueueLen": -1},
		{"maxTCP": 0, "maxUDP": 1 << 20},
		{"busyPoll": "0s"}, {"busyPoll": "1us"}, {"busyPoll": "10ms"}, {"busyPoll": "auto"},
		{"udpIdle": "1s", "readyTimeout": "1s"}, {"udpIdle": "1h30m", "readyTimeout": "2m"},
		{"runDir": "/" + strings.Repeat("r", 84)}, {"runDir": "/" + strings.Repeat("r", 84) + "/"},
		{"kubeconfig": "/etc/cni/net.d/cni-usernet.kubeconfig", "nodeName": "node-1.example.com"},
		{"ipam": nil}, {"rxChecksumOffload": nil},
		{"dns": map[string]any{"nameservers": []any{"10.96.0.10"}}},
		{"capabilities": map[string]any{"io.kubernetes.cri.pod-annotations": true, "cgroupPath": true}},
		{"stackCgroup": "pod"}, {"stackCgroup": "node"}, {"stackCgroup": ""},
		{"unknownKeyOfAnotherTool": []any{1, "x"}},
	} {
		data := conf(t, c)
		if _, err := netconf.Parse(data); err != nil {
			t.Errorf("Parse(%s): %v, want it accepted", data, err)
		}
	}
}

// TestMTUIPv6 checks that an MTU IPv4 allows but IPv6 does not is refused
// when the pod gets IPv6, from any source the plugin can see, and that the
// error says which address made it IPv6.
func TestMTUIPv6(t *testing.T) {
	hostLocal := func(subnets ...string) map[string]any {
		var ranges []any
		for _, s := range subnets {
			ranges = append(ranges, []any{map[string]any{"subnet": s}})
		}
		return map[string]any{"type": "host-local", "ranges": ranges}
	}
	for _, c := range []struct {
		name  string
		extra map[string]any
		v6    string
	}{
		{"host-local ranges", map[string]any{"ipam": hostLocal("10.0.0.0/24", "fd00:1::/64")}, "fd00:1::/64"},
		{"host-local subnet", map[string]any{"ipam": map[string]any{"type": "host-local", "subnet": "fd00:2::/64"}}, "fd00:2::/64"},
		{"static", map[string]any{"ipam": map[string]any{"type": "static",
			"addresses": []any{map[string]any{"address": "fd00:3::5/64"}}}}, "fd00:3::5/64"},
		{"prevResult", map[string]any{"ipam": nil, "prevResult": map[string]any{"cniVersion": "1.1.0",
			"ips": []any{map[string]any{"address": "fd00:4::5/64"}}}}, "fd00:4::5/64"},
	} {
		t.Run(c.name, func(t *testing.T) {
			extra := map[string]any{"mtu": 1279}
			for k, v := range c.extra {
				if v != nil {
					extra[k] = v
				}
			}
			_, err := netconf.Parse(conf(t, extra))
			if err == nil {
				t.Fatal("Parse: got success, want the MTU refused for IPv6")
			}
			for _, p := range []string{`"mtu"`, "1279", "1280..65535", "IPv6", c.v6} {
				if !strings.Contains(err.Error(), p) {
					t.Errorf("error %q: got no %q in it, want it named", err, p)
				}
			}
		})
	}
}

// TestDecodeErrors checks the messages for JSON that is not an object or
// not JSON at all, and for nested keys.
func TestDecodeErrors(t *testing.T) {
	for _, c := range []struct {
		data  string
		parts []string
	}{
		{`{"cniVersion": "1.1.0", "name": "n",}`, []string{"not valid JSON at byte 37"}},
		{`[1, 2]`, []string{"got a JSON array, want an object"}},
		{`"conf"`, []string{"got a JSON string, want an object"}},
		{`null`, []string{`"name" is missing`}},
		{`{"name": "n", "dns": {"nameservers": "10.96.0.10"}}`, []string{`"dns.nameservers"`, "a JSON string", "an array of strings"}},
		{`{"name": "n", "runtimeConfig": {"cgroupPath": 5}}`, []string{`"runtimeConfig.cgroupPath"`, "a JSON number", "a string"}},
		{`{"name": "n", "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"cni-usernet.io/gso": false}}}`,
			[]string{`"runtimeConfig.io.kubernetes.cri.pod-annotations"`, "a JSON bool", "an object of strings"}},
		{`{"name": "n", "mtu": "` + strings.Repeat("x", 200) + `"}`, []string{`"mtu": got "xxx`, "...(202 bytes) (a string)"}},
	} {
		_, err := netconf.Parse([]byte(c.data))
		if err == nil {
			t.Errorf("Parse(%s): got success, want an error", c.data)
			continue
		}
		for _, p := range c.parts {
			if !strings.Contains(err.Error(), p) {
				t.Errorf("Parse(%.60s): error %q: got no %q in it", c.data, err, p)
			}
		}
	}
}
