package netpolicy

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// UnmarshalJSON reads a number or a string.
func (v *IntOrString) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		v.IsString, v.Int = true, 0
		return json.Unmarshal(b, &v.Str)
	}
	n, err := strconv.ParseInt(string(b), 10, 32)
	if err != nil {
		return fmt.Errorf("port %s is neither a number nor a name: %w", b, err)
	}
	v.IsString, v.Int, v.Str = false, int32(n), ""
	return nil
}

// MarshalJSON writes a number or a string.
func (v IntOrString) MarshalJSON() ([]byte, error) {
	if v.IsString {
		return json.Marshal(v.Str)
	}
	return json.Marshal(v.Int)
}
