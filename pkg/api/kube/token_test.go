package kube

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// makeJWT builds an unsigned token with the given claims; TokenTimes does
// not check signatures.
func makeJWT(t *testing.T, claims map[string]any) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return enc(map[string]string{"alg": "RS256", "kid": "k"}) + "." + enc(claims) + ".c2lnbmF0dXJl"
}

func TestTokenTimes(t *testing.T) {
	exp := time.Unix(1800000000, 0)
	iat := time.Unix(1799996400, 0)
	tok := makeJWT(t, map[string]any{"exp": exp.Unix(), "iat": iat.Unix(), "sub": "system:serviceaccount:kube-system:cni-usernet"})
	gotExp, gotIat, err := TokenTimes(tok)
	if err != nil || !gotExp.Equal(exp) || !gotIat.Equal(iat) {
		t.Errorf("got %v, %v, %v, want %v, %v, nil", gotExp, gotIat, err, exp, iat)
	}

	// Fractional NumericDate, padded base64, surrounding blanks.
	parts := strings.Split(makeJWT(t, map[string]any{"exp": 1800000000.5}), ".")
	parts[1] += strings.Repeat("=", (4-len(parts[1])%4)%4)
	gotExp, gotIat, err = TokenTimes(" " + strings.Join(parts, ".") + "\n")
	if want := time.Unix(1800000000, 5e8); err != nil || !gotExp.Equal(want) || !gotIat.IsZero() {
		t.Errorf("fractional exp: got %v, %v, %v, want %v, zero, nil", gotExp, gotIat, err, want)
	}

	for name, tok := range map[string]string{
		"not a JWT":      "a-static-token",
		"two parts":      "a.b",
		"bad base64":     "a.!!!.c",
		"not JSON":       "a." + base64.RawURLEncoding.EncodeToString([]byte("nope")) + ".c",
		"no exp":         makeJWT(t, map[string]any{"iat": 1}),
		"exp as string":  makeJWT(t, map[string]any{"exp": "tomorrow"}),
		"negative exp":   makeJWT(t, map[string]any{"exp": -5}),
		"bad iat":        makeJWT(t, map[string]any{"exp": 1800000000, "iat": "x"}),
		"absurdly large": makeJWT(t, map[string]any{"exp": 1e300}),
	} {
		if _, _, err := TokenTimes(tok); err == nil {
			t.Errorf("%s: got nil error", name)
		}
	}
}

type refresherFiles struct {
	dir, token, ca, kubeconfig string
}

func newRefresherFiles(t *testing.T, caPEM []byte, token string) refresherFiles {
	t.Helper()
	dir := t.TempDir()
	f := refresherFiles{
		dir:        dir,
		token:      filepath.Join(dir, "sa", "token"),
		ca:         filepath.Join(dir, "sa", "ca.crt"),
		kubeconfig: filepath.Join(dir, "net.d", "cni-usernet.d", "kubeconfig"),
	}
	if err := os.MkdirAll(filepath.Dir(f.token), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, f.ca, caPEM)
	writeFileAtomic(t, f.token, token)
	return f
}

func TestTokenRefresherRewritesOnRotation(t *testing.T) {
	now := time.Now()
	tok1 := makeJWT(t, map[string]any{"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "n": 1})
	tok2 := makeJWT(t, map[string]any{"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "n": 2})
	ts := &tokenServer{}
	ts.setValid(tok1)
	srv, _ := newServer(t, ts.handle)
	f := newRefresherFiles(t, serverCA(srv), tok1)
	var logs bytes.Buffer
	r := &TokenRefresher{
		Kubeconfig: f.kubeconfig, Server: srv.URL, TokenFile: f.token, CAFile: f.ca,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	}

	if changed, err := r.Sync(); err != nil || !changed {
		t.Fatalf("first Sync: got %v, %v, want true, nil", changed, err)
	}
	assertMode(t, f.kubeconfig, 0o600)
	if changed, err := r.Sync(); err != nil || changed {
		t.Errorf("Sync without rotation: got %v, %v, want false, nil", changed, err)
	}
	plugin := func() error {
		c, err := LoadKubeconfig(f.kubeconfig)
		if err != nil {
			return err
		}
		_, _, err = c.PodAnnotations(ctxTimeout(t, 2*time.Second), "n", "p")
		return err
	}
	if err := plugin(); err != nil {
		t.Fatalf("plugin with the first token: %v", err)
	}

	writeFileAtomic(t, f.token, tok2+"\n")
	ts.setValid(tok2)
	if err := plugin(); err == nil {
		t.Fatal("plugin before Sync: got nil error, want 401 with the old token")
	}
	if changed, err := r.Sync(); err != nil || !changed {
		t.Fatalf("Sync after rotation: got %v, %v, want true, nil", changed, err)
	}
	assertMode(t, f.kubeconfig, 0o600)
	if err := plugin(); err != nil {
		t.Errorf("plugin after Sync: %v", err)
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("warnings for fresh tokens:\n%s", logs.String())
	}
}

func TestTokenRefresherWarnsNearExpiry(t *testing.T) {
	ca := newTestCA(t)
	now := time.Unix(1800000000, 0)
	for _, tc := range []struct {
		name     string
		iat, exp time.Duration // relative to now
		want     string        // in the warning; "" means no warning
	}{
		{"fresh", -10 * time.Minute, 50 * time.Minute, ""},
		{"at kubelet's rotation point", -48 * time.Minute, 12 * time.Minute, ""},
		{"overdue", -55 * time.Minute, 5 * time.Minute, "expires soon"},
		{"expired", -2 * time.Hour, -time.Minute, "has expired"},
		{"short-lived, fine", -7 * time.Minute, 3 * time.Minute, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := makeJWT(t, map[string]any{"iat": now.Add(tc.iat).Unix(), "exp": now.Add(tc.exp).Unix()})
			f := newRefresherFiles(t, ca.certPEM, tok)
			var logs bytes.Buffer
			r := &TokenRefresher{
				Kubeconfig: f.kubeconfig, Server: "https://10.96.0.1:443", TokenFile: f.token, CAFile: f.ca,
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
				now:    func() time.Time { return now },
			}
			for range 3 {
				if _, err := r.Sync(); err != nil {
					t.Fatalf("Sync: %v", err)
				}
			}
			warnings := strings.Count(logs.String(), "level=WARN")
			switch {
			case tc.want == "" && warnings != 0:
				t.Errorf("got warnings, want none:\n%s", logs.String())
			case tc.want != "" && (warnings != 1 || !strings.Contains(logs.String(), tc.want)):
				t.Errorf("got %d warnings, want exactly one saying %q:\n%s", warnings, tc.want, logs.String())
			}
		})
	}
}

func TestTokenRefresherNotAJWT(t *testing.T) {
	ca := newTestCA(t)
	f := newRefresherFiles(t, ca.certPEM, "static-token")
	var logs bytes.Buffer
	r := &TokenRefresher{
		Kubeconfig: f.kubeconfig, Server: "https://10.96.0.1:443", TokenFile: f.token, CAFile: f.ca,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	}
	for range 2 {
		if _, err := r.Sync(); err != nil {
			t.Fatalf("Sync: %v", err)
		}
	}
	if n := strings.Count(logs.String(), "cannot tell when"); n != 1 {
		t.Errorf("got %d warnings about the expiry, want 1:\n%s", n, logs.String())
	}
}

func TestTokenRefresherRun(t *testing.T) {
	ca := newTestCA(t)
	f := newRefresherFiles(t, ca.certPEM, "tok-a")
	r := &TokenRefresher{
		Kubeconfig: f.kubeconfig, Server: "https://10.96.0.1:443", TokenFile: f.token, CAFile: f.ca,
		Interval: 20 * time.Millisecond,
		Logger:   slog.New(slog.DiscardHandler),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitToken := func(want string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for {
			cfg, err := ReadKubeconfig(f.kubeconfig)
			if err == nil && cfg.Token == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("kubeconfig token: got %q (%v), want %q", cfg.Token, err, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitToken("tok-a")
	writeFileAtomic(t, f.token, "tok-b")
	waitToken("tok-b")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel: got %v, want nil", err)
		}
		done <- nil // for the cleanup
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestTokenRefresherRunFailsFast(t *testing.T) {
	dir := t.TempDir()
	r := &TokenRefresher{
		Kubeconfig: filepath.Join(dir, "kc"), Server: "https://10.96.0.1:443",
		TokenFile: filepath.Join(dir, "missing"), CAFile: filepath.Join(dir, "missing-ca"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := r.Run(ctx); err == nil || ctx.Err() != nil {
		t.Errorf("Run with a missing token: got %v (context %v), want an error at once", err, ctx.Err())
	}
	if err := (&TokenRefresher{}).Validate(); err == nil {
		t.Error("Validate without a server: got nil error")
	}
}
