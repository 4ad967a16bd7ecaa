package control

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// PolicyReply is PUT /policy's answer.
type PolicyReply struct {
	Generation uint64 `json:"generation"`
}

// RefusedError is a policy push the stack refused: Status 400 (the stack
// cannot read it) or 409 (older than the policy in force, or enforcement
// is off), with the stack's reason.
type RefusedError struct {
	Status int
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("stack refused the policy (HTTP %d): %s", e.Status, e.Reason)
}

// PutPolicy pushes p to the stack at path (PUT /policy, docs/policy.md)
// and returns the generation in force; a refusal is a *RefusedError.
func PutPolicy(path string, timeout time.Duration, p *policy.PodPolicy) (uint64, error) {
	b, err := policy.Marshal(p)
	if err != nil {
		return 0, fmt.Errorf("encoding policy: %w", err)
	}
	req, err := http.NewRequest(http.MethodPut, "http://stack/policy", bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client(path, timeout).Do(req)
	if err != nil {
		return 0, fmt.Errorf("pushing policy to stack at %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, &RefusedError{Status: resp.StatusCode, Reason: strings.TrimSpace(string(msg))}
	}
	var reply PolicyReply
	if err := json.NewDecoder(&boundedReader{r: resp.Body, left: MaxStatusBytes}).Decode(&reply); err != nil {
		return 0, fmt.Errorf("decoding policy reply of stack at %s: %w", path, err)
	}
	return reply.Generation, nil
}
