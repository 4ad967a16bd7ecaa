package policy

import "testing"

func TestReasonAndProtoNames(t *testing.T) {
	for r, want := range map[Reason]string{NoRuleAdmits: "no rule admits", NoAllowedBackend: "no allowed backend",
		TinyFragment: "first fragment without ports", TooManyHeaders: "too many extension headers", 99: "reason 99"} {
		if got := r.String(); got != want {
			t.Errorf("Reason(%d): got %q, want %q", r, got, want)
		}
	}
	for p, want := range map[uint8]string{ProtoTCP: "TCP", ProtoUDP: "UDP", ProtoSCTP: "SCTP", ProtoICMP: "ICMP", ProtoICMPv6: "ICMPv6", 47: "47"} {
		if got := ProtoName(p); got != want {
			t.Errorf("ProtoName(%d): got %q, want %q", p, got, want)
		}
	}
}
