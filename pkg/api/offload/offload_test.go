package offload

import (
	"errors"
	"strings"
	"testing"
)

func TestParseMode(t *testing.T) {
	tests := []struct {
		in      string
		want    Mode
		wantErr string
	}{
		{in: "auto", want: ModeAuto},
		{in: "hardware", want: ModeHardware},
		{in: "software", want: ModeSoftware},
		{in: "off", want: ModeOff},
		{in: "", wantErr: "gso mode is empty, want one of auto, hardware, software, off"},
		{in: "Auto", wantErr: `unknown gso mode "Auto", want one of auto, hardware, software, off`},
		{in: "on", wantErr: `unknown gso mode "on"`},
	}
	for _, tt := range tests {
		got, err := ParseMode(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseMode(%q): got error %v, want one containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseMode(%q): got %q, %v, want %q, nil", tt.in, got, err, tt.want)
		}
	}
}

func TestParseModeAcceptsEveryMode(t *testing.T) {
	for _, m := range Modes {
		if got, err := ParseMode(string(m)); err != nil || got != m {
			t.Errorf("ParseMode(%q): got %q, %v, want %q, nil", m, got, err, m)
		}
	}
}

var (
	veth   = LinkGSO{MaxSize: 65536, MaxSegs: 65535, GSO: true, TSO: true}
	gsoOff = LinkGSO{MaxSize: 65536, MaxSegs: 65535}
)

func TestDecide(t *testing.T) {
	tests := []struct {
		name       string
		requested  Mode
		link       LinkGSO
		wantMode   Mode
		wantReason string
		wantErr    string
		wantNoGSO  bool
	}{
		{
			name: "auto with GSO", requested: ModeAuto, link: veth,
			wantMode:   ModeHardware,
			wantReason: "auto: link offers GSO (gso_max_size 65536, gso_max_segs 65535)",
		},
		{
			name: "auto with GSO but no TSO", requested: ModeAuto,
			link:       LinkGSO{MaxSize: 65536, MaxSegs: 65535, GSO: true},
			wantMode:   ModeHardware,
			wantReason: "auto: link offers GSO (gso_max_size 65536, gso_max_segs 65535)",
		},
		{
			name: "auto with gso off", requested: ModeAuto, link: gsoOff,
			wantMode:   ModeSoftware,
			wantReason: "auto: link has no GSO (ethtool generic-segmentation-offload is off), using software",
		},
		{
			name: "auto with gso_max_size 0", requested: ModeAuto,
			link:       LinkGSO{MaxSegs: 65535, GSO: true},
			wantMode:   ModeSoftware,
			wantReason: "auto: link has no GSO (gso_max_size is 0), using software",
		},
		{
			name: "hardware with GSO", requested: ModeHardware, link: veth,
			wantMode:   ModeHardware,
			wantReason: "hardware: requested, link offers GSO (gso_max_size 65536, gso_max_segs 65535)",
		},
		{
			name: "hardware with gso off", requested: ModeHardware, link: gsoOff,
			wantErr:   `gso mode "hardware" requested but link offers no GSO: ethtool generic-segmentation-offload is off`,
			wantNoGSO: true,
		},
		{
			name: "hardware with gso_max_segs 0", requested: ModeHardware,
			link:      LinkGSO{MaxSize: 65536, GSO: true},
			wantErr:   `gso mode "hardware" requested but link offers no GSO: gso_max_segs is 0`,
			wantNoGSO: true,
		},
		{
			name: "hardware with nothing", requested: ModeHardware, link: LinkGSO{},
			wantErr:   "ethtool generic-segmentation-offload is off, gso_max_size is 0, gso_max_segs is 0",
			wantNoGSO: true,
		},
		{name: "software with GSO", requested: ModeSoftware, link: veth, wantMode: ModeSoftware, wantReason: "software: requested"},
		{name: "software without GSO", requested: ModeSoftware, link: LinkGSO{}, wantMode: ModeSoftware, wantReason: "software: requested"},
		{name: "off with GSO", requested: ModeOff, link: veth, wantMode: ModeOff, wantReason: "off: requested"},
		{name: "off without GSO", requested: ModeOff, link: LinkGSO{}, wantMode: ModeOff, wantReason: "off: requested"},
		{name: "empty", requested: "", link: veth, wantErr: "gso mode is empty"},
		{name: "unknown", requested: "turbo", link: veth, wantErr: `unknown gso mode "turbo"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Decide(tt.requested, tt.link)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tt.wantErr)
				}
				if got := errors.Is(err, ErrNoGSO); got != tt.wantNoGSO {
					t.Errorf("errors.Is(err, ErrNoGSO): got %v, want %v", got, tt.wantNoGSO)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want nil", err)
			}
			want := Decision{Requested: tt.requested, Mode: tt.wantMode, Link: tt.link, Reason: tt.wantReason}
			if d != want {
				t.Errorf("got %+v, want %+v", d, want)
			}
		})
	}
}

// TestDecideResolves checks what holds for every mode on every kind of
// link, beyond the table above: auto is always resolved, a requested
// mode is kept, hardware only on a link that offers GSO, and every
// decision gives its reason.
func TestDecideResolves(t *testing.T) {
	links := []LinkGSO{veth, gsoOff, {}, {GSO: true}, {MaxSize: 65536, GSO: true}, {MaxSegs: 1, GSO: true},
		{MaxSize: 1, MaxSegs: 1, GSO: true}, {MaxSize: 65536, MaxSegs: 65535, TSO: true}}
	for _, m := range Modes {
		for _, l := range links {
			d, err := Decide(m, l)
			if err != nil {
				if m != ModeHardware || l.Offers() || !errors.Is(err, ErrNoGSO) {
					t.Errorf("Decide(%s, %+v): got error %v, want one only for hardware on a link without GSO", m, l, err)
				}
				continue
			}
			switch {
			case d.Mode == ModeAuto:
				t.Errorf("Decide(%s, %+v): got mode auto, want a resolved mode", m, l)
			case m != ModeAuto && d.Mode != m:
				t.Errorf("Decide(%s, %+v): got mode %s, want the requested one", m, l, d.Mode)
			case d.Mode == ModeHardware && !l.Offers():
				t.Errorf("Decide(%s, %+v): got hardware on a link without GSO", m, l)
			case m == ModeAuto && l.Offers() != (d.Mode == ModeHardware):
				t.Errorf("Decide(auto, %+v): got %s, want hardware exactly when the link offers GSO (%v)", l, d.Mode, l.Offers())
			case !strings.HasPrefix(d.Reason, string(m)+": "):
				t.Errorf("Decide(%s, %+v): reason %q does not start with the requested mode", m, l, d.Reason)
			case d.Requested != m || d.Link != l:
				t.Errorf("Decide(%s, %+v): got requested %s link %+v, want the inputs", m, l, d.Requested, d.Link)
			}
		}
	}
}

func TestMaxBurst(t *testing.T) {
	tests := []struct {
		name string
		link LinkGSO
		mtu  uint32
		want uint32
	}{
		{name: "veth 1500 bounded by size and IP length", link: veth, mtu: 1500, want: 65522},
		{name: "2 segs at 1500", link: LinkGSO{MaxSize: 65536, MaxSegs: 2, GSO: true}, mtu: 1500, want: 2*(1500-120) + 120},
		{name: "1 seg is one MTU packet", link: LinkGSO{MaxSize: 65536, MaxSegs: 1, GSO: true}, mtu: 1500, want: 1500},
		{name: "44 segs at 1500", link: LinkGSO{MaxSize: 65536, MaxSegs: 44, GSO: true}, mtu: 1500, want: 44*1380 + 120},
		{name: "gso_max_size 16k", link: LinkGSO{MaxSize: 16384, MaxSegs: 65535, GSO: true}, mtu: 1500, want: 16384 - 14},
		{name: "big gso_max_size capped at IP length", link: LinkGSO{MaxSize: 512 << 10, MaxSegs: 65535, GSO: true}, mtu: 9000, want: 65535},
		{name: "huge segs and mtu do not overflow", link: LinkGSO{MaxSize: 65536, MaxSegs: 1 << 31, GSO: true}, mtu: 65535, want: 65522},
		{name: "gso off", link: gsoOff, mtu: 1500, want: 0},
		{name: "gso_max_size 0", link: LinkGSO{MaxSegs: 65535, GSO: true}, mtu: 1500, want: 0},
		{name: "gso_max_segs 0", link: LinkGSO{MaxSize: 65536, GSO: true}, mtu: 1500, want: 0},
		{name: "mtu no larger than headers", link: veth, mtu: 120, want: 0},
		{name: "mtu 0", link: veth, mtu: 0, want: 0},
	}
	for _, tt := range tests {
		if got := tt.link.MaxBurst(tt.mtu); got != tt.want {
			t.Errorf("%s: %+v.MaxBurst(%d): got %d, want %d", tt.name, tt.link, tt.mtu, got, tt.want)
		}
	}
}

// TestMaxBurstFitsSegments checks the derivation: a burst of MaxBurst bytes
// splits into at most MaxSegs segments for every header length the stack can
// emit, and one byte more does not for the largest header.
func TestMaxBurstFitsSegments(t *testing.T) {
	for _, segs := range []uint32{1, 2, 3, 7, 44, 64} {
		for _, mtu := range []uint32{576, 1280, 1500, 9000} {
			l := LinkGSO{MaxSize: 1 << 20, MaxSegs: segs, GSO: true}
			burst := l.MaxBurst(mtu)
			for h := uint32(40); h <= maxHeaderLen; h++ {
				mss := mtu - h
				if n := (burst - h + mss - 1) / mss; n > segs {
					t.Errorf("segs %d mtu %d header %d: burst %d splits into %d segments, want <= %d", segs, mtu, h, burst, n, segs)
				}
			}
			if burst == maxIPPacket {
				continue // bounded by the IP length, not by segments
			}
			mss := mtu - maxHeaderLen
			if n := (burst + 1 - maxHeaderLen + mss - 1) / mss; n <= segs {
				t.Errorf("segs %d mtu %d: burst %d+1 splits into %d segments, want > %d (bound not tight)", segs, mtu, burst, n, segs)
			}
		}
	}
}
