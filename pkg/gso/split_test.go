package gso

import (
	"bytes"
	"encoding/binary"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
)

// buildFrame makes an Ethernet + IP + TCP frame carrying payload, with the
// TCP checksum left partial the way netstack leaves it for GSO.
func buildFrame(v6 bool, payload []byte, flags byte) []byte {
	eth := make([]byte, 14)
	for i := range eth {
		eth[i] = byte(i + 1)
	}
	tcp := make([]byte, 32) // 12 bytes of options (timestamps)
	binary.BigEndian.PutUint16(tcp[0:2], 40000)
	binary.BigEndian.PutUint16(tcp[2:4], 80)
	binary.BigEndian.PutUint32(tcp[4:8], 0xfffffff0) // wraps during the burst
	binary.BigEndian.PutUint32(tcp[8:12], 1234)
	tcp[12] = 8 << 4
	tcp[13] = flags
	binary.BigEndian.PutUint16(tcp[14:16], 512)
	tcp[20], tcp[21], tcp[22] = 1, 1, 8
	tcp[16], tcp[17] = 0xab, 0xcd // stale partial sum
	var ip []byte
	if v6 {
		ip = make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:6], uint16(len(tcp)+len(payload)))
		ip[6], ip[7] = protoTCP, 64
		ip[8], ip[23] = 0xfd, 2
		ip[24], ip[39] = 0xfd, 1
	} else {
		ip = make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:4], uint16(20+len(tcp)+len(payload)))
		binary.BigEndian.PutUint16(ip[4:6], 0xfffe)
		ip[6] = 0x40
		ip[8], ip[9] = 64, protoTCP
		copy(ip[12:16], []byte{10, 0, 0, 2})
		copy(ip[16:20], []byte{10, 0, 0, 1})
	}
	return append(append(append(eth, ip...), tcp...), payload...)
}

func tcpChecksumOK(ip []byte, ipLen int, seg []byte) bool {
	var pseudo []byte
	if ip[0]>>4 == 6 {
		pseudo = append(pseudo, ip[8:40]...)
	} else {
		pseudo = append(pseudo, ip[12:20]...)
	}
	pseudo = binary.BigEndian.AppendUint16(pseudo, protoTCP)
	pseudo = binary.BigEndian.AppendUint16(pseudo, uint16(len(seg)))
	return checksum.Checksum(seg, checksum.Checksum(pseudo, 0)) == 0xffff
}

func TestSplit(t *testing.T) {
	payload := make([]byte, 10000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	for _, c := range []struct {
		name    string
		v6      bool
		payload []byte
		mss     int
		want    int
	}{
		{"v4 burst", false, payload, 1448, 7},
		{"v6 burst", true, payload, 1428, 8},
		{"v4 exact multiple", false, payload[:2896], 1448, 2},
		{"v4 one segment", false, payload[:100], 1448, 1},
		{"v4 no payload", false, nil, 1448, 1},
		{"v6 odd sizes", true, payload[:3001], 999, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			frame := buildFrame(c.v6, c.payload, tcpFlagPSH|tcpFlagFIN|tcpFlagCWR|0x10)
			var segs Segments
			buf := make([]byte, 64*1024)
			if _, err := Split(frame, 14, c.mss, buf, &segs); err != nil {
				t.Fatal(err)
			}
			if len(segs.Headers) != c.want {
				t.Fatalf("segments: got %d, want %d", len(segs.Headers), c.want)
			}
			var joined []byte
			for i, h := range segs.Headers {
				p := segs.Payloads[i]
				if len(p) > c.mss {
					t.Errorf("segment %d carries %d bytes, mss %d", i, len(p), c.mss)
				}
				if !bytes.Equal(h[:14], frame[:14]) {
					t.Errorf("segment %d: link header not copied", i)
				}
				ip := h[14:]
				ipLen := 20
				if c.v6 {
					ipLen = 40
					if got := int(binary.BigEndian.Uint16(ip[4:6])); got != 32+len(p) {
						t.Errorf("segment %d: IPv6 payload length %d, want %d", i, got, 32+len(p))
					}
				} else {
					if got := int(binary.BigEndian.Uint16(ip[2:4])); got != 52+len(p) {
						t.Errorf("segment %d: total length %d, want %d", i, got, 52+len(p))
					}
					if checksum.Checksum(ip[:20], 0) != 0xffff {
						t.Errorf("segment %d: bad IPv4 header checksum", i)
					}
					if got, want := binary.BigEndian.Uint16(ip[4:6]), uint16(0xfffe+i); got != want {
						t.Errorf("segment %d: IP id %#x, want %#x", i, got, want)
					}
				}
				tcp := ip[ipLen:]
				if got, want := binary.BigEndian.Uint32(tcp[4:8]), uint32(0xfffffff0)+uint32(i*c.mss); got != want {
					t.Errorf("segment %d: seq %#x, want %#x", i, got, want)
				}
				seg := append(append([]byte{}, tcp...), p...)
				if !tcpChecksumOK(ip, ipLen, seg) {
					t.Errorf("segment %d: bad TCP checksum", i)
				}
				last, first := i == len(segs.Headers)-1, i == 0
				if f := tcp[13]; (f&tcpFlagFIN != 0) != last || (f&tcpFlagPSH != 0) != last || (f&tcpFlagCWR != 0) != first || f&0x10 == 0 {
					t.Errorf("segment %d: flags %#x", i, f)
				}
				joined = append(joined, p...)
			}
			if !bytes.Equal(joined, c.payload) {
				t.Errorf("payload differs after split")
			}
		})
	}
}

func TestSplitRejects(t *testing.T) {
	var segs Segments
	buf := make([]byte, 4096)
	good := buildFrame(false, make([]byte, 3000), 0x10)
	udp := append([]byte{}, good...)
	udp[14+9] = 17
	for name, c := range map[string]struct {
		frame []byte
		mss   int
		buf   []byte
	}{
		"short":          {good[:20], 1448, buf},
		"not TCP":        {udp, 1448, buf},
		"zero mss":       {good, 0, buf},
		"small buffer":   {good, 100, buf[:200]},
		"truncated":      {good[:60], 1448, buf},
		"bad IP version": {append([]byte{}, good[:14]...), 1448, buf},
	} {
		if _, err := Split(c.frame, 14, c.mss, c.buf, &segs); err == nil {
			t.Errorf("%s: got no error", name)
		}
	}
}

// fuzzBuf is reused: allocating it per input dominated the fuzzer's time.
var fuzzBuf [256 << 10]byte

func FuzzSplit(f *testing.F) {
	f.Add(buildFrame(false, make([]byte, 300), 0x18), 100)
	f.Add(buildFrame(true, make([]byte, 200), 0x11), 64)
	f.Add([]byte{0x45, 0, 0, 20}, 1)
	f.Fuzz(func(t *testing.T, frame []byte, mss int) {
		if mss <= 0 || mss > 65535 {
			mss = 1448
		}
		var segs Segments
		if _, err := Split(frame, 14, mss, fuzzBuf[:], &segs); err != nil {
			return
		}
		var joined []byte
		for i, p := range segs.Payloads {
			if len(p) > mss {
				t.Fatalf("segment %d has %d bytes > mss %d", i, len(p), mss)
			}
			if i < len(segs.Payloads)-1 && len(p) != mss {
				t.Fatalf("segment %d of %d has %d bytes, want mss %d (only the last may be short)", i, len(segs.Payloads), len(p), mss)
			}
			joined = append(joined, p...)
		}
		if len(segs.Headers) != len(segs.Payloads) || len(segs.Headers) == 0 {
			t.Fatalf("%d headers, %d payloads", len(segs.Headers), len(segs.Payloads))
		}
		// The segments carry exactly the TCP payload the IP and TCP
		// headers of the input delimit, in order.
		ip := frame[14:]
		var ipEnd, ipLen int
		if ip[0]>>4 == 6 {
			ipLen, ipEnd = 40, 40+int(binary.BigEndian.Uint16(ip[4:6]))
		} else {
			ipLen, ipEnd = int(ip[0]&0x0f)*4, int(binary.BigEndian.Uint16(ip[2:4]))
		}
		want := ip[ipLen+int(ip[ipLen+12]>>4)*4 : ipEnd]
		if !bytes.Equal(joined, want) {
			t.Fatalf("segments carry %d payload bytes, want the input's %d", len(joined), len(want))
		}
	})
}

func BenchmarkSplit64K(b *testing.B) {
	frame := buildFrame(false, make([]byte, 65000), 0x18)
	var segs Segments
	buf := make([]byte, 64*1024)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		segs.Reset()
		Split(frame, 14, 1448, buf, &segs)
	}
}
