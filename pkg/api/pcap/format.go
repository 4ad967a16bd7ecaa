package pcap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Packets travel and are written as Linux "cooked" v2 frames
// (LINKTYPE_LINUX_SLL2, what `tcpdump -i any` writes): a 20-byte header
// with the ethertype, the interface index in the pod's network namespace,
// the ARPHRD type, the direction and the link-layer source address, then
// the packet from its network header on. One link type for every leg,
// because libpcap 1.10 (Debian 12's tcpdump) refuses a pcapng whose
// interfaces differ in link type ("an interface has a type 101 different
// from the type of the first interface"), and the wire leg is Ethernet
// while the TUN is raw IP; SLL2 also carries what a two-leg capture needs
// per packet, the interface and the direction, which tcpdump prints.
const (
	// LinkTypeSLL2 is LINKTYPE_LINUX_SLL2.
	LinkTypeSLL2 = 276
	// SLL2HeaderLen is the cooked header's length.
	SLL2HeaderLen = 20
	// DefaultSnapLen is tcpdump's default: whole packets, also the
	// 64 KiB segments of GSO and loopback.
	DefaultSnapLen = 262144
)

// Packet types (sll2_pkttype), as Linux's PACKET_* constants.
const (
	PacketHost      = 0
	PacketBroadcast = 1
	PacketMulticast = 2
	PacketOtherHost = 3
	PacketOutgoing  = 4
)

// ARPHRD types of the legs' devices.
const (
	ARPHRDEther    = 1
	ARPHRDLoopback = 772
	ARPHRDNone     = 0xfffe
)

// Packet is one captured packet: Frame is the SLL2 header and as much of
// the packet as the snap length kept, OrigLen the packet's whole length
// (header included).
type Packet struct {
	Time    time.Time
	Frame   []byte
	OrigLen int
	// Iface is the packet's interface in the output (Writer's list).
	Iface int
}

// SLL2 fills h (SLL2HeaderLen bytes) for a packet.
func SLL2(h []byte, ethertype uint16, ifIndex uint32, hatype uint16, pktType uint8, addr []byte) {
	binary.BigEndian.PutUint16(h[0:2], ethertype)
	binary.BigEndian.PutUint16(h[2:4], 0)
	binary.BigEndian.PutUint32(h[4:8], ifIndex)
	binary.BigEndian.PutUint16(h[8:10], hatype)
	h[10] = pktType
	n := copy(h[12:20], addr)
	h[11] = byte(n)
	clear(h[12+n : 20])
}

// SetIfIndex rewrites the interface index of an SLL2 frame.
func SetIfIndex(frame []byte, ifIndex uint32) {
	if len(frame) >= SLL2HeaderLen {
		binary.BigEndian.PutUint32(frame[4:8], ifIndex)
	}
}

// Outgoing reports whether an SLL2 frame was sent by the capturing side.
func Outgoing(frame []byte) bool {
	return len(frame) >= SLL2HeaderLen && frame[10] == PacketOutgoing
}

// The stack streams its wire leg as classic pcap with nanosecond
// timestamps (so that `curl --unix-socket ... | tcpdump -r -` works by
// hand too); the capture command reads it back.
const (
	pcapMagicNanos = 0xa1b23c4d
	pcapHeaderLen  = 24
	pcapRecordLen  = 16
)

// WritePcapHeader writes a classic pcap file header for SLL2 frames.
func WritePcapHeader(w io.Writer, snapLen int) error {
	var h [pcapHeaderLen]byte
	binary.LittleEndian.PutUint32(h[0:4], pcapMagicNanos)
	binary.LittleEndian.PutUint16(h[4:6], 2)
	binary.LittleEndian.PutUint16(h[6:8], 4)
	binary.LittleEndian.PutUint32(h[16:20], uint32(snapLen))
	binary.LittleEndian.PutUint32(h[20:24], LinkTypeSLL2)
	_, err := w.Write(h[:])
	return err
}

// WritePcapRecord writes one packet of a classic pcap stream.
func WritePcapRecord(w io.Writer, p *Packet) error {
	var h [pcapRecordLen]byte
	binary.LittleEndian.PutUint32(h[0:4], uint32(p.Time.Unix()))
	binary.LittleEndian.PutUint32(h[4:8], uint32(p.Time.Nanosecond()))
	binary.LittleEndian.PutUint32(h[8:12], uint32(len(p.Frame)))
	binary.LittleEndian.PutUint32(h[12:16], uint32(p.OrigLen))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.Write(p.Frame)
	return err
}

// PcapReader reads the stack's stream: classic pcap, nanosecond
// timestamps, SLL2 frames.
type PcapReader struct {
	r       *bufio.Reader
	snapLen int
}

// NewPcapReader reads and checks the file header.
func NewPcapReader(r io.Reader) (*PcapReader, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var h [pcapHeaderLen]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return nil, fmt.Errorf("reading the pcap header: %w", err)
	}
	if m := binary.LittleEndian.Uint32(h[0:4]); m != pcapMagicNanos {
		return nil, fmt.Errorf("pcap magic %#x, want %#x (little-endian, nanoseconds)", m, uint32(pcapMagicNanos))
	}
	if lt := binary.LittleEndian.Uint32(h[20:24]); lt != LinkTypeSLL2 {
		return nil, fmt.Errorf("pcap link type %d, want %d (LINUX_SLL2)", lt, LinkTypeSLL2)
	}
	return &PcapReader{r: br, snapLen: int(binary.LittleEndian.Uint32(h[16:20]))}, nil
}

// Next reads one packet; io.EOF at a clean end of stream.
func (pr *PcapReader) Next() (Packet, error) {
	var h [pcapRecordLen]byte
	if _, err := io.ReadFull(pr.r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Packet{}, fmt.Errorf("pcap record header cut short: %w", err)
		}
		return Packet{}, err
	}
	incl := int(binary.LittleEndian.Uint32(h[8:12]))
	if incl > pr.snapLen || incl > DefaultSnapLen*4 {
		return Packet{}, fmt.Errorf("pcap record of %d bytes beyond the snap length %d", incl, pr.snapLen)
	}
	p := Packet{
		Time:    time.Unix(int64(binary.LittleEndian.Uint32(h[0:4])), int64(binary.LittleEndian.Uint32(h[4:8]))),
		Frame:   make([]byte, incl),
		OrigLen: int(binary.LittleEndian.Uint32(h[12:16])),
	}
	if _, err := io.ReadFull(pr.r, p.Frame); err != nil {
		return Packet{}, fmt.Errorf("pcap record cut short: %w", err)
	}
	return p, nil
}
