package pcap

import (
	"encoding/binary"
	"io"
	"time"
)

// The capture command's output is pcapng (the format made for several
// interfaces in one file): one interface description per leg's device,
// named as in the pod ("eth0", "lo", "usernet0") with the leg in its
// description, so that Wireshark shows per packet where it was seen, while
// tcpdump reads the same file and prints the SLL2 direction and, with -e,
// the pod's interface index.

const (
	blockSHB = 0x0a0d0d0a
	blockIDB = 1
	blockISB = 5
	blockEPB = 6

	optEnd        = 0
	optIfName     = 2
	optIfDesc     = 3
	optIfTsresol  = 9
	optEPBFlags   = 2
	optISBIfRecv  = 4
	optISBIfDrop  = 5
	epbInbound    = 1
	epbOutbound   = 2
	tsresolNanos  = 9
	byteOrderMark = 0x1a2b3c4d
)

// Interface is one of the output's interfaces.
type Interface struct {
	// Name is the device's name in the pod, Description says which leg.
	Name, Description string
	// Leg is "wire" or "app"; IfIndex the device's index in the pod,
	// which every packet's SLL2 header carries.
	Leg     string
	IfIndex int
	SnapLen int
}

// PcapngWriter writes a pcapng stream. Not safe for concurrent use.
type PcapngWriter struct {
	w   io.Writer
	buf []byte
}

// NewPcapngWriter writes the section header and the interfaces.
func NewPcapngWriter(w io.Writer, ifaces []Interface) (*PcapngWriter, error) {
	pw := &PcapngWriter{w: w}
	var shb []byte
	shb = binary.LittleEndian.AppendUint32(shb, byteOrderMark)
	shb = binary.LittleEndian.AppendUint16(shb, 1)
	shb = binary.LittleEndian.AppendUint16(shb, 0)
	shb = binary.LittleEndian.AppendUint64(shb, ^uint64(0)) // section length unknown: a stream
	if err := pw.block(blockSHB, shb); err != nil {
		return nil, err
	}
	for _, ifc := range ifaces {
		var b []byte
		b = binary.LittleEndian.AppendUint16(b, LinkTypeSLL2)
		b = binary.LittleEndian.AppendUint16(b, 0)
		b = binary.LittleEndian.AppendUint32(b, uint32(ifc.SnapLen))
		b = option(b, optIfName, []byte(ifc.Name))
		b = option(b, optIfDesc, []byte(ifc.Description))
		b = option(b, optIfTsresol, []byte{tsresolNanos})
		b = option(b, optEnd, nil)
		if err := pw.block(blockIDB, b); err != nil {
			return nil, err
		}
	}
	return pw, nil
}

// WritePacket writes an enhanced packet block.
func (pw *PcapngWriter) WritePacket(p *Packet) error {
	b := pw.buf[:0]
	ts := uint64(p.Time.UnixNano())
	b = binary.LittleEndian.AppendUint32(b, uint32(p.Iface))
	b = binary.LittleEndian.AppendUint32(b, uint32(ts>>32))
	b = binary.LittleEndian.AppendUint32(b, uint32(ts))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p.Frame)))
	b = binary.LittleEndian.AppendUint32(b, uint32(p.OrigLen))
	b = append(b, p.Frame...)
	b = pad4(b)
	flags := uint32(epbInbound)
	if Outgoing(p.Frame) {
		flags = epbOutbound
	}
	b = option(b, optEPBFlags, binary.LittleEndian.AppendUint32(nil, flags))
	b = option(b, optEnd, nil)
	pw.buf = b
	return pw.block(blockEPB, b)
}

// WriteStats writes an interface statistics block: what the interface
// received and what was dropped before it reached the output.
func (pw *PcapngWriter) WriteStats(iface int, t time.Time, received, dropped uint64) error {
	var b []byte
	ts := uint64(t.UnixNano())
	b = binary.LittleEndian.AppendUint32(b, uint32(iface))
	b = binary.LittleEndian.AppendUint32(b, uint32(ts>>32))
	b = binary.LittleEndian.AppendUint32(b, uint32(ts))
	b = option(b, optISBIfRecv, binary.LittleEndian.AppendUint64(nil, received))
	b = option(b, optISBIfDrop, binary.LittleEndian.AppendUint64(nil, dropped))
	b = option(b, optEnd, nil)
	return pw.block(blockISB, b)
}

func (pw *PcapngWriter) block(typ uint32, body []byte) error {
	n := uint32(12 + len(body))
	var h [8]byte
	binary.LittleEndian.PutUint32(h[0:4], typ)
	binary.LittleEndian.PutUint32(h[4:8], n)
	if _, err := pw.w.Write(h[:]); err != nil {
		return err
	}
	if _, err := pw.w.Write(body); err != nil {
		return err
	}
	_, err := pw.w.Write(h[4:8])
	return err
}

func option(b []byte, code uint16, val []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, code)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(val)))
	b = append(b, val...)
	return pad4(b)
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
