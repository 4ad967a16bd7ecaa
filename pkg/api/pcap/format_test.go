package pcap

import (
	"bytes"
	"io"
	"testing"
	"time"
)

func TestPcapRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := WritePcapHeader(&buf, 100); err != nil {
		t.Fatal(err)
	}
	frame := make([]byte, SLL2HeaderLen+10)
	SLL2(frame, 0x0800, 7, ARPHRDEther, PacketOutgoing, []byte{1, 2, 3, 4, 5, 6})
	want := Packet{Time: time.Unix(1700000000, 123456789), Frame: frame, OrigLen: 1500}
	if err := WritePcapRecord(&buf, &want); err != nil {
		t.Fatal(err)
	}
	pr, err := NewPcapReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pr.Next()
	if err != nil {
		t.Fatal(err)
	}
	if !got.Time.Equal(want.Time) || !bytes.Equal(got.Frame, want.Frame) || got.OrigLen != want.OrigLen {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if !Outgoing(got.Frame) {
		t.Error("packet type lost")
	}
	SetIfIndex(got.Frame, 42)
	if got.Frame[7] != 42 {
		t.Errorf("ifindex byte %d, want 42", got.Frame[7])
	}
	if _, err := pr.Next(); err != io.EOF {
		t.Errorf("after the last record: %v, want EOF", err)
	}
}

// FuzzPcapReader feeds the stream reader arbitrary bytes: it must fail
// cleanly, never panic or allocate beyond the snap length it checks.
func FuzzPcapReader(f *testing.F) {
	var seed bytes.Buffer
	WritePcapHeader(&seed, 64)
	WritePcapRecord(&seed, &Packet{Time: time.Unix(1, 2), Frame: make([]byte, SLL2HeaderLen+4), OrigLen: 30})
	f.Add(seed.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		pr, err := NewPcapReader(bytes.NewReader(b))
		if err != nil {
			return
		}
		for range 100 {
			p, err := pr.Next()
			if err != nil {
				return
			}
			if len(p.Frame) > pr.snapLen {
				t.Fatalf("frame of %d bytes beyond the snap length %d", len(p.Frame), pr.snapLen)
			}
		}
	})
}
