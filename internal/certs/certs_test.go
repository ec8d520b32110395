package certs

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLocalCAIsReusedAcrossRestarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	now := time.Now()
	first, err := ServerConfig(dir, "", "", []string{"db.example"}, now)
	if err != nil {
		t.Fatal(err)
	}
	ca1, _ := os.ReadFile(CAPath(dir))
	second, err := ServerConfig(dir, "", "", []string{"db.example"}, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ca2, _ := os.ReadFile(CAPath(dir))
	if !bytes.Equal(ca1, ca2) {
		t.Fatal("the CA was regenerated on the second start; clients trusting it would break")
	}
	if !bytes.Equal(first.Certificates[0].Certificate[0], second.Certificates[0].Certificate[0]) {
		t.Fatal("the server certificate was regenerated although still valid")
	}
	// The server certificate verifies against the CA for every name.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca1)
	leaf := second.Certificates[0].Leaf
	for _, name := range []string{"localhost", "app.localhost", "127.0.0.1", "db.example"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool}); err != nil {
			t.Errorf("certificate does not verify for %s: %v", name, err)
		}
	}
	for _, p := range []string{filepath.Join(Dir(dir), caKeyFile), filepath.Join(Dir(dir), keyFile)} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", p, fi.Mode().Perm(), err)
		}
	}
}

func TestServerCertificateRenewedNearExpiry(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	now := time.Now()
	first, err := ServerConfig(dir, "", "", nil, now)
	if err != nil {
		t.Fatal(err)
	}
	later, err := ServerConfig(dir, "", "", nil, now.Add(validity-renewAfter/2))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(first.Certificates[0].Certificate[0], later.Certificates[0].Certificate[0]) {
		t.Fatal("a certificate about to expire was not renewed")
	}
}

func TestUserCertificateErrors(t *testing.T) {
	t.Parallel()
	// A user certificate: take a generated pair and copy it out.
	src := t.TempDir()
	if _, err := ServerConfig(src, "", "", nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(Dir(src), certFile), filepath.Join(Dir(src), keyFile)
	unreadable := filepath.Join(t.TempDir(), "missing.pem")

	tests := []struct {
		name      string
		cert, key string
		now       time.Time
		want      string
	}{
		{name: "cert without key", cert: cert, want: "needs its key"},
		{name: "key without cert", key: key, want: "needs its key"},
		{name: "unreadable", cert: unreadable, key: key, want: "missing.pem"},
		{name: "expired", cert: cert, key: key, now: time.Now().Add(2 * validity), want: "expired on"},
		{name: "not yet valid", cert: cert, key: key, now: time.Now().Add(-48 * time.Hour), want: "not valid before"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := tt.now
			if now.IsZero() {
				now = time.Now()
			}
			_, err := ServerConfig(t.TempDir(), tt.cert, tt.key, nil, now)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
		})
	}
	conf, err := ServerConfig(t.TempDir(), cert, key, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if conf.MinVersion != tls.VersionTLS12 || len(conf.NextProtos) != 1 || conf.NextProtos[0] != "postgresql" {
		t.Fatalf("config %+v", conf)
	}
}
