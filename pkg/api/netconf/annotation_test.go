package netconf_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
)

// FuzzGSOAnnotation feeds arbitrary strings to the pod annotation parser
// (NetConf.GSOMode, which uses offload.ParseMode), the way a user's
// annotation reaches it: exactly the four modes are accepted; anything
// else is an error that names the annotation, shows the value, lists the
// modes, and stays one short printable line, since it is posted as a pod
// Event and logged.
func FuzzGSOAnnotation(f *testing.F) {
	for _, s := range []string{"auto", "hardware", "software", "off", "", "Auto", " off", "off\n",
		"hardware\x00", "turbo", "\xff\xfe", "ö", strings.Repeat("x", 65), strings.Repeat("é", 40)} {
		f.Add(s)
	}
	c, err := netconf.Parse(conf(f, map[string]any{"gso": "software"}))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, v string) {
		nc := *c
		nc.RuntimeConfig.PodAnnotations = map[string]string{netconf.AnnotationGSO: v, "other": v}
		mode, source, err := nc.GSOMode()
		valid := slices.Contains(offload.Modes, offload.Mode(v))
		if err == nil {
			if !valid || string(mode) != v || source != "annotation "+netconf.AnnotationGSO {
				t.Fatalf("GSOMode with annotation %q: got %q from %q, want an error", v, mode, source)
			}
			return
		}
		if valid {
			t.Fatalf("GSOMode with annotation %q: got %v, want mode %q", v, err, v)
		}
		msg := err.Error()
		if !strings.Contains(msg, strconv.Quote(netconf.AnnotationGSO)) || !strings.Contains(msg, "auto, hardware, software, off") {
			t.Errorf("error %q: want the annotation and the accepted modes named", msg)
		}
		if q := strconv.Quote(v); len(q) <= 66 && v != "" && !strings.Contains(msg, q) {
			t.Errorf("error %q: want the value %q quoted in it", msg, v)
		}
		if len(msg) > 256 || !utf8.ValidString(msg) || strings.ContainsFunc(msg, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Errorf("error %q (%d bytes): want one printable line of at most 256 bytes", msg, len(msg))
		}
	})
}

// TestSocketRedirectMode: the annotation chooses under the conflist,
// whose "off" wins; a bad value names the annotation and the values.
func TestSocketRedirectMode(t *testing.T) {
	for _, c := range []struct {
		conflist, annotation string // "" : absent
		want, source         string
	}{
		{"", "", "off", "default"},
		{"", "both", "both", "annotation cni-usernet.io/socket-redirect"},
		{"on", "", "on", "conflist socketRedirect"},
		{"both", "", "both", "conflist socketRedirect"},
		{"on", "both", "both", "annotation cni-usernet.io/socket-redirect"},
		{"on", "off", "off", "annotation cni-usernet.io/socket-redirect"},
		{"both", "on", "on", "annotation cni-usernet.io/socket-redirect"},
		{"off", "both", "off", "conflist socketRedirect"},
	} {
		keys := map[string]any{}
		if c.conflist != "" {
			keys["socketRedirect"] = c.conflist
		}
		nc, err := netconf.Parse(conf(t, keys))
		if err != nil {
			t.Fatal(err)
		}
		if c.annotation != "" {
			nc.RuntimeConfig.PodAnnotations = map[string]string{netconf.AnnotationSocketRedirect: c.annotation}
		}
		mode, source, err := nc.SocketRedirectMode()
		if err != nil || mode != c.want || source != c.source {
			t.Errorf("conflist %q, annotation %q: got %q by %q (%v), want %q by %q", c.conflist, c.annotation, mode, source, err, c.want, c.source)
		}
	}
	nc, err := netconf.Parse(conf(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	nc.RuntimeConfig.PodAnnotations = map[string]string{netconf.AnnotationSocketRedirect: "fast"}
	if _, _, err := nc.SocketRedirectMode(); err == nil || !strings.Contains(err.Error(), "socket-redirect") || !strings.Contains(err.Error(), "on, both, direct, off") {
		t.Errorf("bad annotation: got %v, want an error naming it and the values", err)
	}
	if _, err := netconf.Parse(conf(t, map[string]any{"socketRedirect": "sometimes"})); err == nil {
		t.Error(`socketRedirect "sometimes": accepted`)
	}
}
