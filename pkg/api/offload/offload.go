// Package offload is the decision of how a pod link segments large packets:
// the requested Mode, what a link offers (LinkGSO, read from the kernel by
// pkg/node/ethtool), and the mode and size limits the userspace stack must
// honour. Decide and MaxBurst are pure functions of a LinkGSO, so the
// policy is testable without a kernel.
package offload

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Mode says how the userspace stack segments TCP bursts larger than the MTU.
type Mode string

const (
	// ModeAuto picks ModeHardware when the link offers GSO and ModeSoftware
	// otherwise.
	ModeAuto Mode = "auto"
	// ModeHardware hands the link GSO packets with a virtio-net header and
	// lets the kernel (or the device) segment them.
	ModeHardware Mode = "hardware"
	// ModeSoftware hands the kernel 64 KiB GSO packets with a virtio-net
	// header, as ModeHardware does, and has the kernel's GSO segment them
	// in software on the way to the link, whatever the link offers (the
	// stack turns the link's TSO off, see LinkTSOOff): MTU-sized frames on
	// the wire, one system call and one copy per 64 KiB for the stack. It
	// is not gVisor's own software GSO, which splits inside TCP.
	ModeSoftware Mode = "software"
	// ModeOff disables GSO entirely: the stack builds MTU-sized segments
	// one at a time.
	ModeOff Mode = "off"
)

// VnetHdr reports whether the link's packet sockets carry a virtio-net
// header in mode m: the stack hands the kernel GSO packets.
func (m Mode) VnetHdr() bool { return m == ModeHardware || m == ModeSoftware }

// Modes lists the accepted values of Mode, in the order error messages show
// them.
var Modes = []Mode{ModeAuto, ModeHardware, ModeSoftware, ModeOff}

// ErrNoGSO is returned (wrapped) by Decide when hardware GSO is requested
// on a link that does not offer it.
var ErrNoGSO = errors.New("link offers no GSO")

// ParseMode returns the Mode named by s. The empty string and unknown names
// are errors that list the accepted values; callers that want a default
// must apply it before parsing.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	if s == "" {
		return "", fmt.Errorf("gso mode is empty, want one of %s", modeList())
	}
	return "", fmt.Errorf("unknown gso mode %s, want one of %s", quoteShort(s), modeList())
}

// maxQuoted bounds how much of a bad value an error repeats, counted in
// bytes of the quoted form: annotations come from users, and the error
// lands in pod Events and logs.
const maxQuoted = 66

// quoteShort quotes s (control bytes and invalid UTF-8 escaped, so an
// error never breaks a log line), cut on a character boundary so that the
// quoted form stays within maxQuoted bytes.
func quoteShort(s string) string {
	q := strconv.Quote(s)
	if len(q) <= maxQuoted {
		return q
	}
	cut := min(len(s), maxQuoted-2)
	for {
		for cut > 0 && cut < len(s) && !utf8.RuneStart(s[cut]) {
			cut--
		}
		if q = strconv.Quote(s[:cut]); len(q) <= maxQuoted {
			return fmt.Sprintf("%s...(%d bytes)", q, len(s))
		}
		cut--
	}
}

func modeList() string {
	names := make([]string, len(Modes))
	for i, m := range Modes {
		names[i] = string(m)
	}
	return strings.Join(names, ", ")
}

// LinkGSO is what the kernel reports about a link's segmentation offload.
type LinkGSO struct {
	MaxSize uint32 `json:"maxSize"` // gso_max_size (netlink IFLA_GSO_MAX_SIZE)
	MaxSegs uint32 `json:"maxSegs"` // gso_max_segs (netlink IFLA_GSO_MAX_SEGS)
	GSO     bool   `json:"gso"`     // ethtool generic-segmentation-offload (ETHTOOL_GGSO)
	TSO     bool   `json:"tso"`     // ethtool tcp-segmentation-offload (ETHTOOL_GTSO)
}

// Offers reports whether the link accepts GSO packets: the
// generic-segmentation-offload feature is on and both size limits are
// non-zero.
//
// TSO is not required. With GSO on and TSO off the kernel still accepts a
// GSO packet and segments it in software just before the driver
// (validate_xmit_skb), which is one syscall per burst instead of one per
// segment; TSO only moves that last step into the device.
func (l LinkGSO) Offers() bool {
	return l.GSO && l.MaxSize > 0 && l.MaxSegs > 0
}

// why says, for an error or a reason, why the link does not offer GSO. It
// is empty when Offers is true.
func (l LinkGSO) why() string {
	var r []string
	if !l.GSO {
		r = append(r, "ethtool generic-segmentation-offload is off")
	}
	if l.MaxSize == 0 {
		r = append(r, "gso_max_size is 0")
	}
	if l.MaxSegs == 0 {
		r = append(r, "gso_max_segs is 0")
	}
	return strings.Join(r, ", ")
}

const (
	// maxHeaderLen is the largest IP header plus TCP header a segment can
	// carry: an IPv4 header with options (60 bytes, IHL 15) plus a TCP
	// header with options (60 bytes, data offset 15). IPv6 without
	// extension headers is smaller (40 + 60).
	maxHeaderLen = 60 + 60

	// ethHeaderLen is the Ethernet header the kernel adds in front of the
	// IP packet; gso_max_size bounds the whole frame the driver gets.
	ethHeaderLen = 14

	// maxIPPacket is the largest packet the 16-bit IPv4 total length (and
	// the IPv6 payload length without a jumbo option) can describe. BIG TCP
	// is out of scope.
	maxIPPacket = 1<<16 - 1
)

// MaxBurst returns the largest GSO packet, in bytes of IP header plus
// payload, that the stack may hand the link when the link MTU is mtu. It
// returns 0 when the link does not offer GSO or mtu leaves no room for a
// payload after the largest headers.
//
// Two limits apply, and the result is the smaller:
//
//   - gso_max_size bounds the whole frame the driver is given, Ethernet
//     header included, and the IP length fields cap a packet at 65535:
//     min(MaxSize - 14, 65535).
//
//   - gso_max_segs bounds how many segments the burst may split into
//     (above it the kernel drops the offload for the packet). Every segment
//     repeats the headers, so with header length h each segment carries at
//     most mss = mtu - h payload bytes, and a burst of h + p bytes splits
//     into ceil(p / mss) segments. Keeping that <= MaxSegs needs
//     p <= MaxSegs*(mtu - h), i.e. a burst of at most
//     MaxSegs*(mtu - h) + h = MaxSegs*mtu - (MaxSegs-1)*h bytes. The bound
//     shrinks as h grows, so it is taken at the largest header the stack
//     can emit (maxHeaderLen, 120). The naive MaxSegs*mtu is wrong: with
//     gso_max_segs 2 and MTU 1500 it allows 3000 bytes, whose 2940 payload
//     bytes need three 1460-byte segments.
func (l LinkGSO) MaxBurst(mtu uint32) uint32 {
	if !l.Offers() || mtu <= maxHeaderLen || l.MaxSize <= ethHeaderLen {
		return 0
	}
	bySize := min(uint64(l.MaxSize)-ethHeaderLen, maxIPPacket)
	bySegs := uint64(l.MaxSegs)*uint64(mtu-maxHeaderLen) + maxHeaderLen
	return uint32(min(bySize, bySegs))
}

// Decision is the resolved mode with the limits the stack must honour.
type Decision struct {
	Requested Mode    `json:"requested"`
	Mode      Mode    `json:"mode"` // never ModeAuto
	Link      LinkGSO `json:"link"`
	Reason    string  `json:"reason"` // for humans: logs and CNI CHECK output
}

// Decide resolves requested against what link offers. ModeAuto becomes
// ModeHardware when link.Offers() and ModeSoftware otherwise; ModeHardware
// on a link that does not offer GSO is an error wrapping ErrNoGSO that says
// which limit is missing; ModeSoftware and ModeOff are always accepted.
// The error does not name the link: the caller wraps it with the name.
func Decide(requested Mode, link LinkGSO) (Decision, error) {
	if _, err := ParseMode(string(requested)); err != nil {
		return Decision{}, err
	}
	d := Decision{Requested: requested, Mode: requested, Link: link}
	limits := fmt.Sprintf("gso_max_size %d, gso_max_segs %d", link.MaxSize, link.MaxSegs)
	switch requested {
	case ModeAuto:
		if link.Offers() {
			d.Mode = ModeHardware
			d.Reason = fmt.Sprintf("auto: link offers GSO (%s)", limits)
		} else {
			d.Mode = ModeSoftware
			d.Reason = fmt.Sprintf("auto: link has no GSO (%s), using software", link.why())
		}
	case ModeHardware:
		if !link.Offers() {
			return Decision{}, fmt.Errorf("gso mode %q requested but %w: %s", requested, ErrNoGSO, link.why())
		}
		d.Reason = fmt.Sprintf("hardware: requested, link offers GSO (%s)", limits)
	case ModeSoftware, ModeOff:
		d.Reason = fmt.Sprintf("%s: requested", requested)
	}
	return d, nil
}
