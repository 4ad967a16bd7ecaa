package offload

import (
	"strings"
	"testing"
)

// TestParseModeLongValue checks that a long or binary value is shown
// short and escaped: the error becomes a pod Event and a log line.
func TestParseModeLongValue(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
	}{
		{strings.Repeat("x", 100), `"` + strings.Repeat("x", 64) + `"...(100 bytes)`},
		{strings.Repeat("é", 40), `"` + strings.Repeat("é", 32) + `"...(80 bytes)`},
		{"off\nlevel=ERROR fake", `"off\nlevel=ERROR fake"`},
		{strings.Repeat("\xff", 20), `"` + strings.Repeat(`\xff`, 16) + `"...(20 bytes)`},
	} {
		_, err := ParseMode(c.in)
		if err == nil {
			t.Fatalf("ParseMode(%q): got no error", c.in)
		}
		if want := "unknown gso mode " + c.want + ", want one of auto, hardware, software, off"; err.Error() != want {
			t.Errorf("ParseMode(%q):\n got %s\nwant %s", c.in, err, want)
		}
	}
}
