package kube

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// TokenTimes returns the exp (expiry) and iat (issued at) claims of a JWT
// such as a service account token. The signature is not checked: the API
// server does that; this only tells how long the token will be accepted.
// A token without iat gives a zero iat; one without exp is an error.
func TokenTimes(token string) (exp, iat time.Time, err error) {
	parts := strings.Split(strings.TrimSpace(token), ".")
	if len(parts) != 3 {
		return time.Time{}, time.Time{}, fmt.Errorf("token is not a JWT: %d dot-separated parts, want 3", len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("decoding the JWT payload: %w", err)
	}
	var claims struct {
		Exp json.Number `json:"exp"`
		Iat json.Number `json:"iat"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("decoding the JWT claims: %w", err)
	}
	if claims.Exp == "" {
		return time.Time{}, time.Time{}, errors.New("JWT without an exp claim")
	}
	if exp, err = numericDate(claims.Exp); err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("JWT exp claim: %w", err)
	}
	if claims.Iat != "" {
		if iat, err = numericDate(claims.Iat); err != nil {
			return time.Time{}, time.Time{}, fmt.Errorf("JWT iat claim: %w", err)
		}
	}
	return exp, iat, nil
}

// numericDate converts a JWT NumericDate (seconds since the epoch, which
// RFC 7519 allows to have a fraction).
func numericDate(n json.Number) (time.Time, error) {
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e12 {
		return time.Time{}, fmt.Errorf("%q is not a date in seconds", string(n))
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)), nil
}

// DefaultRefreshInterval is how often a TokenRefresher looks at the token
// file when TokenRefresher.Interval is zero. kubelet replaces a projected
// token when 80% of its lifetime has passed (at least 10 minutes, usually
// an hour), so the copy is never more than a few seconds behind and
// reading one small file this often costs nothing.
const DefaultRefreshInterval = 10 * time.Second

// expiryWarnFraction: warn when less than this part of the token's
// lifetime is left. kubelet should have rotated it with 20% left; below
// 10% it has missed its own deadline by half the margin.
const expiryWarnFraction = 0.10

// expiryWarnFixed is the warning margin for a token without iat.
const expiryWarnFixed = 5 * time.Minute

// TokenRefresher keeps the plugin's kubeconfig in step with the agent's
// own service account token, which kubelet rotates: the host-side plugin
// cannot read the projected volume, so the agent copies the token (and
// CA) into the kubeconfig whenever it changes. The plugin then acts with
// the agent's RBAC permissions.
type TokenRefresher struct {
	// Kubeconfig is the file to keep up to date. Empty means
	// DefaultKubeconfig.
	Kubeconfig string
	// Server is the API server URL written for the plugin. Required:
	// the agent chooses between the in-cluster service address and a
	// direct one (docs/kube.md says why it matters).
	Server string
	// TokenFile is the agent's token. Empty means the pod's service
	// account token under ServiceAccountDir.
	TokenFile string
	// CAFile is the cluster CA bundle. Empty means the pod's service
	// account ca.crt under ServiceAccountDir.
	CAFile string
	// Interval is the time between checks. Zero means
	// DefaultRefreshInterval.
	Interval time.Duration
	// Logger receives rewrites and expiry warnings. Nil means
	// slog.Default().
	Logger *slog.Logger

	now func() time.Time // time.Now unless a test sets it

	mu     sync.Mutex // guards warned, serialises Sync
	warned string     // the token last warned about, to warn once per token
}

// Validate reports a missing required field.
func (r *TokenRefresher) Validate() error {
	if r.Server == "" {
		return errors.New("token refresher without a server URL")
	}
	if r.Interval < 0 {
		return fmt.Errorf("token refresher interval %v: want > 0", r.Interval)
	}
	return nil
}

func (r *TokenRefresher) paths() (kubeconfig, token, ca string) {
	kubeconfig, token, ca = r.Kubeconfig, r.TokenFile, r.CAFile
	if kubeconfig == "" {
		kubeconfig = DefaultKubeconfig
	}
	if token == "" {
		token = filepath.Join(ServiceAccountDir, tokenFileName)
	}
	if ca == "" {
		ca = filepath.Join(ServiceAccountDir, caFileName)
	}
	return kubeconfig, token, ca
}

func (r *TokenRefresher) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.Default()
}

// Sync rewrites the kubeconfig if the token, CA or server changed, and
// warns if the token is close to expiry. It says whether it wrote.
func (r *TokenRefresher) Sync() (bool, error) {
	if err := r.Validate(); err != nil {
		return false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	kubeconfig, tokenFile, caFile := r.paths()
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		return false, fmt.Errorf("reading the agent's token: %w", err)
	}
	token := strings.TrimSpace(string(b))
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return false, fmt.Errorf("reading the cluster CA: %w", err)
	}
	changed, err := WriteKubeconfig(kubeconfig, r.Server, ca, token)
	if err != nil {
		return false, err
	}
	log := r.logger().With("kubeconfig", kubeconfig, "tokenFile", tokenFile)
	exp, iat, experr := TokenTimes(token)
	if changed {
		log.Info("wrote the plugin's kubeconfig", "server", r.Server, "tokenExpiry", exp)
	}
	r.checkExpiry(log, token, exp, iat, experr)
	return changed, nil
}

func (r *TokenRefresher) checkExpiry(log *slog.Logger, token string, exp, iat time.Time, err error) {
	if r.warned == token {
		return
	}
	now := time.Now
	if r.now != nil {
		now = r.now
	}
	if err != nil {
		r.warned = token
		log.Warn("cannot tell when the plugin's token expires", "error", err)
		return
	}
	left := exp.Sub(now())
	margin := expiryWarnFixed
	if !iat.IsZero() && exp.After(iat) {
		margin = time.Duration(float64(exp.Sub(iat)) * expiryWarnFraction)
	}
	switch {
	case left <= 0:
		r.warned = token
		log.Warn("the plugin's token has expired and was not rotated: pod ADDs that read annotations from the API server will fail",
			"expiredAt", exp)
	case left < margin:
		r.warned = token
		log.Warn("the plugin's token expires soon and was not rotated yet: is kubelet refreshing the agent's projected token?",
			"expiresAt", exp, "left", left.Round(time.Second))
	}
}

// Run calls Sync now and every Interval until ctx ends. A failure of the
// first Sync is returned, so a misconfigured agent stops at start; later
// failures are logged and retried.
func (r *TokenRefresher) Run(ctx context.Context) error {
	if _, err := r.Sync(); err != nil {
		return fmt.Errorf("refreshing the plugin's kubeconfig: %w", err)
	}
	interval := r.Interval
	if interval == 0 {
		interval = DefaultRefreshInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if _, err := r.Sync(); err != nil {
				r.logger().Warn("refreshing the plugin's kubeconfig", "error", err)
			}
		}
	}
}
