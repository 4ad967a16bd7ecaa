package netconf_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
)

// conf is a minimal valid configuration with extra keys merged over it.
func conf(t testing.TB, extra map[string]any) []byte {
	t.Helper()
	c := map[string]any{"cniVersion": "1.1.0", "name": "net", "type": "cni-usernet"}
	for k, v := range extra {
		c[k] = v
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseDefaults(t *testing.T) {
	c, err := netconf.Parse(conf(t, nil))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"MTU", c.MTU, 1500},
		{"GSO", c.GSO, string(offload.ModeAuto)},
		{"TUNName", c.TUNName, stackconfig.DefaultTUNName},
		{"TUNMTU", c.TUNMTU, uint32(0)},
		{"StateDir", c.StateDir, netconf.DefaultStateDir},
		{"LogDir", c.LogDir, netconf.DefaultLogDir},
		{"RunDir", c.RunDir, netconf.DefaultRunDir},
		{"ReadyTimeoutDuration", c.ReadyTimeoutDuration(), netconf.DefaultReadyTimeout},
		{"UDPIdleDuration", c.UDPIdleDuration(), time.Duration(0)},
		{"Chained", c.Chained(), false},
		{"RXChecksumOffload", c.RXChecksumOffload == nil, true},
		{"GROEnabled", c.GROEnabled(), true},
		{"StackCgroup", c.StackCgroup, netconf.StackCgroupPod},
		{"StackConfig GRO", c.StackConfig("eth0", offload.ModeHardware, netconf.StackFiles{Spec: "/spec", ControlSocket: "/sock"}).GRO, true},
	} {
		if f.got != f.want {
			t.Errorf("%s: got %v, want %v", f.name, f.got, f.want)
		}
	}
}

func TestParseKeepsValues(t *testing.T) {
	c, err := netconf.Parse(conf(t, map[string]any{
		"mtu": 9000, "gso": "software", "gsoMaxSize": 32768, "gsoMaxSegs": 16, "gro": false,
		"rxChecksumOffload": false, "tunName": "tun7", "tunMTU": 9000, "maxTCP": 10, "maxUDP": 20,
		"udpIdle": "45s", "podLinkOffloadsOff": true, "stateDir": "/s", "logDir": "/l", "runDir": "/r",
		"readyTimeout": "1m", "busyPoll": "200us", "stackCgroup": "node",
		"runtimeConfig": map[string]any{
			"io.kubernetes.cri.pod-annotations": map[string]any{"cni-usernet.io/gso": "off", "other": "x"},
			"cgroupPath":                        "/kubepods/pod1",
		},
	}))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"MTU", c.MTU, 9000},
		{"GSO", c.GSO, "software"},
		{"GSOMaxSize", c.GSOMaxSize, uint32(32768)},
		{"GSOMaxSegs", c.GSOMaxSegs, uint32(16)},
		{"GROEnabled", c.GROEnabled(), false},
		{"StackConfig BusyPoll", time.Duration(c.StackConfig("eth0", offload.ModeHardware, netconf.StackFiles{Spec: "/s", ControlSocket: "/c"}).BusyPoll), 200 * time.Microsecond},
		{"RXChecksumOffload", c.RXChecksumOffload != nil && !*c.RXChecksumOffload, true},
		{"TUNName", c.TUNName, "tun7"},
		{"TUNMTU", c.TUNMTU, uint32(9000)},
		{"MaxTCP", c.MaxTCP, 10},
		{"MaxUDP", c.MaxUDP, 20},
		{"UDPIdleDuration", c.UDPIdleDuration(), 45 * time.Second},
		{"PodLinkOffloadsOff", c.PodLinkOffloadsOff, true},
		{"StateDir", c.StateDir, "/s"},
		{"LogDir", c.LogDir, "/l"},
		{"RunDir", c.RunDir, "/r"},
		{"ReadyTimeoutDuration", c.ReadyTimeoutDuration(), time.Minute},
		{"CgroupPath", c.RuntimeConfig.CgroupPath, "/kubepods/pod1"},
		{"StackCgroup", c.StackCgroup, netconf.StackCgroupNode},
		{"annotation", c.RuntimeConfig.PodAnnotations[netconf.AnnotationGSO], "off"},
	} {
		if f.got != f.want {
			t.Errorf("%s: got %v, want %v", f.name, f.got, f.want)
		}
	}
}

// TestParsePrevResult checks that a prevResult makes the configuration
// chained, in every version that carries one.
func TestParsePrevResult(t *testing.T) {
	for _, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		prev := map[string]any{
			"cniVersion": v,
			"interfaces": []any{map[string]any{"name": "eth0", "sandbox": "/var/run/netns/x"}},
			"ips":        []any{map[string]any{"address": "10.1.2.3/24", "interface": 0}},
		}
		if v == "0.4.0" {
			prev["ips"].([]any)[0].(map[string]any)["version"] = "4"
		}
		c, err := netconf.Parse(conf(t, map[string]any{"cniVersion": v, "prevResult": prev}))
		if err != nil {
			t.Fatalf("%s: Parse: %v", v, err)
		}
		if !c.Chained() || c.PrevResult == nil {
			t.Errorf("%s: Chained: got %v (PrevResult %v), want true", v, c.Chained(), c.PrevResult)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct {
		name  string
		data  []byte
		parts []string
	}{
		{"not JSON", []byte(`{"cniVersion":`), []string{"parsing network configuration"}},
		{"mtu wrong type", conf(t, map[string]any{"mtu": "big"}), []string{"mtu", "string"}},
		{"mtu too small", conf(t, map[string]any{"mtu": 575}), []string{`"mtu"`, "575", "576..65535"}},
		{"mtu too large", conf(t, map[string]any{"mtu": 65536}), []string{`"mtu"`, "65536"}},
		{"mtu negative", conf(t, map[string]any{"mtu": -1}), []string{`"mtu"`, "-1"}},
		{"unknown gso", conf(t, map[string]any{"gso": "turbo"}), []string{`"gso"`, `"turbo"`, "auto, hardware, software, off"}},
		{"gso wrong case", conf(t, map[string]any{"gso": "Auto"}), []string{`"gso"`, `"Auto"`}},
		{"tunName too long", conf(t, map[string]any{"tunName": "sixteen-bytes-xx"}), []string{`"tunName"`, "sixteen-bytes-xx", "15 bytes"}},
		{"tunName with slash", conf(t, map[string]any{"tunName": "tun/0"}), []string{`"tunName"`, "tun/0", "interface name"}},
		{"tunName with colon", conf(t, map[string]any{"tunName": "tun:0"}), []string{`"tunName"`, "tun:0"}},
		{"tunName with space", conf(t, map[string]any{"tunName": "tun 0"}), []string{`"tunName"`, "tun 0"}},
		{"tunName dot", conf(t, map[string]any{"tunName": ".."}), []string{`"tunName"`, `".."`}},
		{"tunMTU too small", conf(t, map[string]any{"tunMTU": 1279}), []string{`"tunMTU"`, "1279", "1280..65535"}},
		{"tunMTU too large", conf(t, map[string]any{"tunMTU": 65536}), []string{`"tunMTU"`, "65536"}},
		{"tunMTU negative", conf(t, map[string]any{"tunMTU": -1}), []string{"tunMTU"}},
		{"maxTCP negative", conf(t, map[string]any{"maxTCP": -1}), []string{`"maxTCP"`, "negative"}},
		{"maxUDP negative", conf(t, map[string]any{"maxUDP": -5}), []string{`"maxUDP"`, "negative"}},
		{"udpIdle negative", conf(t, map[string]any{"udpIdle": "-3s"}), []string{`"udpIdle"`, `"-3s"`, "positive duration"}},
		{"udpIdle zero", conf(t, map[string]any{"udpIdle": "0s"}), []string{`"udpIdle"`, `"0s"`}},
		{"udpIdle no unit", conf(t, map[string]any{"udpIdle": "30"}), []string{`"udpIdle"`, `"30"`}},
		{"udpIdle wrong type", conf(t, map[string]any{"udpIdle": 30}), []string{"udpIdle", "number"}},
		{"readyTimeout garbage", conf(t, map[string]any{"readyTimeout": "soon"}), []string{`"readyTimeout"`, `"soon"`}},
		{"stateDir relative", conf(t, map[string]any{"stateDir": "state"}), []string{`"stateDir"`, `"state"`, "absolute"}},
		{"logDir relative", conf(t, map[string]any{"logDir": "./log"}), []string{`"logDir"`, `"./log"`, "absolute"}},
		{"runDir relative", conf(t, map[string]any{"runDir": "run"}), []string{`"runDir"`, `"run"`, "absolute"}},
		{"gro wrong type", conf(t, map[string]any{"gro": "yes"}), []string{"gro", "string"}},
		{"annotations wrong type", conf(t, map[string]any{"runtimeConfig": map[string]any{
			"io.kubernetes.cri.pod-annotations": map[string]any{"cni-usernet.io/gso": 1},
		}}), []string{"io.kubernetes.cri.pod-annotations"}},
		{"prevResult garbage", conf(t, map[string]any{"prevResult": map[string]any{"ips": "none"}}), []string{"prevResult"}},
		{"prevResult unknown version", conf(t, map[string]any{"cniVersion": "9.9.9", "prevResult": map[string]any{}}), []string{"prevResult", "9.9.9"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := netconf.Parse(c.data)
			if err == nil {
				t.Fatalf("Parse(%s): got %+v, want an error", c.data, got)
			}
			for _, p := range c.parts {
				if !strings.Contains(err.Error(), p) {
					t.Errorf("error %q: got no %q in it, want it named", err, p)
				}
			}
		})
	}
}

func TestGSOMode(t *testing.T) {
	annotated := func(v string) map[string]any {
		return map[string]any{"io.kubernetes.cri.pod-annotations": map[string]any{netconf.AnnotationGSO: v}}
	}
	for _, c := range []struct {
		name       string
		extra      map[string]any
		wantMode   offload.Mode
		wantSource string
		wantErr    []string
	}{
		{"default", nil, offload.ModeAuto, "conflist default", nil},
		{"conflist", map[string]any{"gso": "hardware"}, offload.ModeHardware, "conflist default", nil},
		{"annotation beats conflist", map[string]any{"gso": "hardware", "runtimeConfig": annotated("off")},
			offload.ModeOff, "annotation cni-usernet.io/gso", nil},
		{"annotation alone", map[string]any{"runtimeConfig": annotated("software")},
			offload.ModeSoftware, "annotation cni-usernet.io/gso", nil},
		{"other annotations ignored", map[string]any{"gso": "off", "runtimeConfig": map[string]any{
			"io.kubernetes.cri.pod-annotations": map[string]any{"cni-usernet.io/other": "x", "gso": "hardware"},
		}}, offload.ModeOff, "conflist default", nil},
		{"bad annotation", map[string]any{"gso": "off", "runtimeConfig": annotated("turbo")}, "", "",
			[]string{"pod annotation", `"cni-usernet.io/gso"`, `"turbo"`, "auto, hardware, software, off"}},
		{"empty annotation", map[string]any{"runtimeConfig": annotated("")}, "", "",
			[]string{`"cni-usernet.io/gso"`, "empty", "auto, hardware, software, off"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			nc, err := netconf.Parse(conf(t, c.extra))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			mode, source, err := nc.GSOMode()
			if c.wantErr != nil {
				if err == nil {
					t.Fatalf("GSOMode: got %s from %s, want an error", mode, source)
				}
				for _, p := range c.wantErr {
					if !strings.Contains(err.Error(), p) {
						t.Errorf("error %q: got no %q in it, want it named", err, p)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("GSOMode: %v", err)
			}
			if mode != c.wantMode || source != c.wantSource {
				t.Errorf("GSOMode: got %s from %q, want %s from %q", mode, source, c.wantMode, c.wantSource)
			}
		})
	}
}

// TestBusyPollWindow checks that busy polling is left to the stack's
// governor by default and by "auto", that the pod annotation overrides
// the conflist's busyPoll (also to turn it off or back to auto), that a
// window from the annotation is the governor's to switch while the
// conflist's polls always, that the stack's configuration carries what
// was resolved and where the window came from, and that a bad
// annotation is an error naming the annotation, the value and what it
// takes.
func TestBusyPollWindow(t *testing.T) {
	annotated := func(v string) map[string]any {
		return map[string]any{"io.kubernetes.cri.pod-annotations": map[string]any{netconf.AnnotationBusyPoll: v}}
	}
	for _, c := range []struct {
		name     string
		extra    map[string]any
		want     time.Duration
		governed bool
		wantErr  []string
	}{
		{"default: auto", nil, 0, true, nil},
		{"conflist auto", map[string]any{"busyPoll": "auto"}, 0, true, nil},
		{"conflist: always", map[string]any{"busyPoll": "50us"}, 50 * time.Microsecond, false, nil},
		{"conflist off", map[string]any{"busyPoll": "0s"}, 0, false, nil},
		{"annotation beats conflist, governed", map[string]any{"busyPoll": "50us", "runtimeConfig": annotated("200us")}, 200 * time.Microsecond, true, nil},
		{"annotation turns it off", map[string]any{"busyPoll": "50us", "runtimeConfig": annotated("0s")}, 0, false, nil},
		{"annotation back to auto", map[string]any{"busyPoll": "0s", "runtimeConfig": annotated("auto")}, 0, true, nil},
		{"annotation alone, governed", map[string]any{"runtimeConfig": annotated("1ms")}, time.Millisecond, true, nil},
		{"bad annotation", map[string]any{"busyPoll": "50us", "runtimeConfig": annotated("fast")}, 0, false,
			[]string{"pod annotation", `"cni-usernet.io/busy-poll"`, `"fast"`, `"auto"`, "at most 10ms"}},
		{"annotation too long", map[string]any{"runtimeConfig": annotated("1s")}, 0, false,
			[]string{`"cni-usernet.io/busy-poll"`, `"1s"`, "at most 10ms"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			nc, err := netconf.Parse(conf(t, c.extra))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got, governed, err := nc.BusyPollWindow()
			if c.wantErr != nil {
				if err == nil {
					t.Fatalf("BusyPollWindow: got %s, want an error", got)
				}
				for _, p := range c.wantErr {
					if !strings.Contains(err.Error(), p) {
						t.Errorf("error %q: got no %q in it, want it named", err, p)
					}
				}
				return
			}
			if err != nil || got != c.want || governed != c.governed {
				t.Fatalf("BusyPollWindow: got %s, governed %v, %v, want %s, governed %v", got, governed, err, c.want, c.governed)
			}
			sc := nc.StackConfig("eth0", offload.ModeHardware, netconf.StackFiles{Spec: "/s", ControlSocket: "/c"})
			// The source travels in the key: the conflist's window in
			// busyPoll (always), the annotation's in busyPollGoverned.
			var wantAlways, wantGoverned time.Duration
			if c.governed {
				wantGoverned = c.want
			} else {
				wantAlways = c.want
			}
			if time.Duration(sc.BusyPoll) != wantAlways || time.Duration(sc.BusyPollGoverned) != wantGoverned {
				t.Errorf("stack configuration: busyPoll %s, busyPollGoverned %s; want %s, %s",
					time.Duration(sc.BusyPoll), time.Duration(sc.BusyPollGoverned), wantAlways, wantGoverned)
			}
			window, scGoverned := sc.BusyPollWindow()
			wantWindow := c.want
			if c.governed && c.want == 0 {
				wantWindow = stackconfig.DefaultBusyPoll
			}
			if window != wantWindow || scGoverned != c.governed || sc.BusyPollOff != (c.want == 0 && !c.governed) {
				t.Errorf("stack configuration: busyPoll %s, off %v, resolved to %s governed %v; want %s governed %v",
					time.Duration(sc.BusyPoll), sc.BusyPollOff, window, scGoverned, wantWindow, c.governed)
			}
		})
	}
}

// FuzzParse checks that Parse never panics and that whatever it accepts
// is valid: a configuration the plugin would act on must not fail later
// for a reason Parse could have seen.
func FuzzParse(f *testing.F) {
	f.Add(conf(f, nil))
	f.Add(conf(f, map[string]any{"mtu": 9000, "gso": "software", "tunName": "tun0", "tunMTU": 1280,
		"udpIdle": "1m", "readyTimeout": "5s", "stateDir": "/s", "logDir": "/l", "runDir": "/r", "stackCgroup": "node"}))
	f.Add(conf(f, map[string]any{"runtimeConfig": map[string]any{
		"io.kubernetes.cri.pod-annotations": map[string]any{"cni-usernet.io/gso": "off"}}}))
	f.Add(conf(f, map[string]any{"prevResult": map[string]any{"cniVersion": "1.1.0",
		"ips": []any{map[string]any{"address": "10.0.0.2/24"}}}}))
	f.Add(conf(f, map[string]any{"cniVersion": "0.3.1", "prevResult": map[string]any{}}))
	f.Add([]byte(`{"mtu": -1, "gso": "", "tunName": "..", "udpIdle": "-0s"}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"prevResult": null, "runtimeConfig": null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := netconf.Parse(data)
		if err != nil {
			if c != nil {
				t.Errorf("Parse returned a configuration beside error %v", err)
			}
			return
		}
		if c.MTU < 576 || c.MTU > 65535 {
			t.Errorf("MTU: got %d, want 576..65535", c.MTU)
		}
		if _, err := offload.ParseMode(c.GSO); err != nil {
			t.Errorf("GSO: got %q: %v", c.GSO, err)
		}
		if n := c.TUNName; n == "" || len(n) > 15 || n == "." || n == ".." || strings.ContainsAny(n, "/: \t\n\v\f\r") {
			t.Errorf("TUNName: got %q, want a valid interface name", n)
		}
		if c.TUNMTU != 0 && (c.TUNMTU < 1280 || c.TUNMTU > 65535) {
			t.Errorf("TUNMTU: got %d, want 0 or 1280..65535", c.TUNMTU)
		}
		if c.StackCgroup != netconf.StackCgroupPod && c.StackCgroup != netconf.StackCgroupNode {
			t.Errorf("StackCgroup: got %q, want %q or %q", c.StackCgroup, netconf.StackCgroupPod, netconf.StackCgroupNode)
		}
		if c.MaxTCP < 0 || c.MaxUDP < 0 {
			t.Errorf("MaxTCP, MaxUDP: got %d, %d, want non-negative", c.MaxTCP, c.MaxUDP)
		}
		if c.UDPIdleDuration() < 0 {
			t.Errorf("UDPIdleDuration: got %s, want non-negative", c.UDPIdleDuration())
		}
		if c.ReadyTimeoutDuration() <= 0 {
			t.Errorf("ReadyTimeoutDuration: got %s, want positive", c.ReadyTimeoutDuration())
		}
		for name, dir := range map[string]string{"StateDir": c.StateDir, "LogDir": c.LogDir, "RunDir": c.RunDir} {
			if !filepath.IsAbs(dir) {
				t.Errorf("%s: got %q, want an absolute path", name, dir)
			}
		}
		if c.Name == "" {
			t.Errorf("Name: got empty, want the network's name")
		}
		if !netconf.ValidIfName(c.TUNName) || c.TUNName == "lo" || strings.Contains(c.TUNName, "%") {
			t.Errorf("TUNName: got %q, want a literal interface name", c.TUNName)
		}
		if c.WireQueueLen < -1 || c.AppQueueLen < -1 || c.WireQueueLen > 65536 || c.AppQueueLen > 65536 {
			t.Errorf("queue lengths: got %d, %d, want -1..65536", c.WireQueueLen, c.AppQueueLen)
		}
		// The control socket, runDir/<16 hex>.sock, must fit in sun_path.
		if n := len(filepath.Join(c.RunDir, strings.Repeat("k", 16)+".sock")); n > 107 {
			t.Errorf("RunDir %q: control socket path of %d bytes, want at most 107", c.RunDir, n)
		}
		if c.Chained() != (c.PrevResult != nil) {
			t.Errorf("Chained: got %v with PrevResult %v", c.Chained(), c.PrevResult)
		}
		mode, _, err := c.GSOMode()
		if err == nil {
			if _, perr := offload.ParseMode(string(mode)); perr != nil {
				t.Errorf("GSOMode: got %q: %v", mode, perr)
			}
		} else if !strings.Contains(err.Error(), netconf.AnnotationGSO) {
			t.Errorf("GSOMode error %q: want it to name %s", err, netconf.AnnotationGSO)
		}
	})
}

// TestStackConfig: the one conversion from a conflist to the stack's
// configuration carries every setting, the checksum switch with its
// meaning (rxChecksumOffload false: the stack verifies).
func TestStackConfig(t *testing.T) {
	c, err := netconf.Parse([]byte(`{"cniVersion":"1.1.0","name":"n","type":"cni-usernet","ipam":{"type":"host-local"},
		"tunName":"tun7","tunMTU":9000,"gsoMaxSize":32768,"gsoMaxSegs":8,"gro":false,"rxChecksumOffload":false,
		"wireQueueLen":-1,"stackThreads":2,"maxTCP":10,"maxUDP":20,"udpIdle":"15s","podLinkOffloadsOff":true,
		"networkPolicy":true,"busyPoll":"75us"}`))
	if err != nil {
		t.Fatal(err)
	}
	got := c.StackConfig("eth1", offload.ModeSoftware, netconf.StackFiles{Spec: "/spec", ControlSocket: "/sock", Policy: "/policy"})
	want := stackconfig.Config{IfName: "eth1", GSO: offload.ModeSoftware, SpecPath: "/spec", ControlSocket: "/sock",
		Policy: true, PolicyPath: "/policy",
		TUNName: "tun7", TUNMTU: 9000, GSOMaxSize: 32768, GSOMaxSegs: 8, GRO: false, VerifyRXChecksums: true,
		WireQueueLen: -1, Threads: 2, MaxTCP: 10, MaxUDP: 20, UDPIdle: stackconfig.Duration(15 * time.Second), PodLinkOffloadsOff: true,
		BusyPoll: stackconfig.Duration(75 * time.Microsecond)}
	if got != want {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("the stack refuses what the conflist produced: %v", err)
	}
	d, _ := netconf.Parse([]byte(`{"cniVersion":"1.1.0","name":"n","type":"cni-usernet","ipam":{"type":"host-local"}}`))
	dc := d.StackConfig("eth0", offload.ModeAuto, netconf.StackFiles{Spec: "/s", ControlSocket: "/c", Policy: "/p"})
	if dc.VerifyRXChecksums {
		t.Fatal("checksums verified by default")
	}
	if dc.Policy {
		t.Fatal("network policy enforced by default")
	}
}
