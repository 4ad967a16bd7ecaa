package policy

import (
	"fmt"
	"os"

	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
)

// ReadFile reads and validates the policy file at path (the attachment's
// policy.json). A missing file is an error that satisfies
// errors.Is(err, fs.ErrNotExist).
func ReadFile(path string) (*PodPolicy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading policy file: %w", err)
	}
	p, err := Unmarshal(b)
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	return p, nil
}

// WriteFile writes p to path atomically: a stack that starts meanwhile
// reads the old policy or the new one, never half of one.
func WriteFile(path string, p *PodPolicy) error {
	b, err := Marshal(p)
	if err != nil {
		return fmt.Errorf("encoding policy: %w", err)
	}
	return atomicfile.Write(path, b, 0o600)
}
