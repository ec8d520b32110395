// Package certs provides the proxy's TLS certificate: a user-supplied
// certificate and key, or a local CA and a server certificate generated
// once and kept in the state directory, so clients can verify pgwake with
// sslmode=verify-full against the CA.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Files of the generated local CA, inside the state directory's tls/.
const (
	CAFile     = "ca.pem"
	caKeyFile  = "ca-key.pem"
	certFile   = "server.pem"
	keyFile    = "server-key.pem"
	dirName    = "tls"
	caValidity = 10 * 365 * 24 * time.Hour
	validity   = 397 * 24 * time.Hour // what browsers accept; clients do not care
	renewAfter = 30 * 24 * time.Hour  // renew a server certificate this close to expiry
)

// Dir is where the generated CA and server certificate live.
func Dir(stateDir string) string { return filepath.Join(stateDir, dirName) }

// CAPath is the generated CA certificate, for sslrootcert.
func CAPath(stateDir string) string { return filepath.Join(Dir(stateDir), CAFile) }

// ServerConfig returns a TLS config for the proxy: from certFile and
// keyFile when given, else from the generated local CA (created on first
// use, reused across restarts). hosts are put in a generated certificate's
// names. A half-configured, unreadable, not yet valid or expired
// certificate is an error.
func ServerConfig(stateDir, userCert, userKey string, hosts []string, now time.Time) (*tls.Config, error) {
	var cert tls.Certificate
	var err error
	switch {
	case userCert != "" && userKey != "":
		cert, err = tls.LoadX509KeyPair(userCert, userKey)
		if err != nil {
			return nil, fmt.Errorf("tls: load %s and %s: %w", userCert, userKey, err)
		}
	case userCert != "" || userKey != "":
		return nil, errors.New("tls: a certificate needs its key: set both tls.cert and tls.key")
	default:
		cert, err = localCert(stateDir, hosts, now)
		if err != nil {
			return nil, err
		}
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("tls: parse certificate: %w", err)
	}
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("tls: certificate %q expired on %s", leaf.Subject.CommonName, leaf.NotAfter.Format(time.DateOnly))
	}
	if now.Before(leaf.NotBefore) {
		return nil, fmt.Errorf("tls: certificate %q is not valid before %s", leaf.Subject.CommonName, leaf.NotBefore.Format(time.DateOnly))
	}
	cert.Leaf = leaf
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// PG17 direct TLS clients must offer "postgresql"; clients that
		// negotiate with SSLRequest may offer it or nothing.
		NextProtos: []string{"postgresql"},
	}, nil
}

// localCert loads the generated server certificate, creating the CA and
// certificate when missing, and renewing the certificate when it nears
// expiry or lacks one of hosts.
func localCert(stateDir string, hosts []string, now time.Time) (tls.Certificate, error) {
	dir := Dir(stateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, fmt.Errorf("tls: %w", err)
	}
	ca, caKey, err := loadOrCreateCA(dir, now)
	if err != nil {
		return tls.Certificate{}, err
	}
	certPath, keyPath := filepath.Join(dir, certFile), filepath.Join(dir, keyFile)
	if cert, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err == nil && now.Add(renewAfter).Before(leaf.NotAfter) && covers(leaf, hosts) && leaf.CheckSignatureFrom(ca) == nil {
			return cert, nil
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "pgwake"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range names(hosts) {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls: sign server certificate: %w", err)
	}
	if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
		return tls.Certificate{}, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := writePEM(keyPath, "EC PRIVATE KEY", kder, 0o600); err != nil {
		return tls.Certificate{}, err
	}
	return tls.LoadX509KeyPair(certPath, keyPath)
}

// names are the certificate's names: localhost and *.localhost (for SNI
// routing), loopback addresses, and hosts.
func names(hosts []string) []string {
	out := []string{"localhost", "*.localhost", "127.0.0.1", "::1"}
	for _, h := range hosts {
		if h != "" && !slices.Contains(out, h) {
			if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() {
				continue
			}
			out = append(out, h)
		}
	}
	return out
}

func covers(leaf *x509.Certificate, hosts []string) bool {
	for _, h := range names(hosts) {
		if h == "*.localhost" {
			continue
		}
		if leaf.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

func loadOrCreateCA(dir string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	caPath, keyPath := filepath.Join(dir, CAFile), filepath.Join(dir, caKeyFile)
	if pair, err := tls.LoadX509KeyPair(caPath, keyPath); err == nil {
		ca, err := x509.ParseCertificate(pair.Certificate[0])
		key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
		if err == nil && ok && now.Before(ca.NotAfter) {
			return ca, key, nil
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "pgwake local CA", Organization: []string{"pgwake"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: create CA: %w", err)
	}
	if err := writePEM(caPath, "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := writePEM(keyPath, "EC PRIVATE KEY", kder, 0o600); err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("tls: write %s: %w", path, err)
	}
	return os.Chmod(path, mode)
}

// UpstreamConfig is the client TLS config for connections to project
// servers: with caFile the servers' certificates are verified against it,
// without it any certificate is accepted (libpq's sslmode=require).
func UpstreamConfig(caFile string) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		conf.InsecureSkipVerify = true // sslmode=require: encryption without verification, by request
		return conf, nil
	}
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls.upstream_ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("tls.upstream_ca: no certificate in %s", caFile)
	}
	conf.RootCAs = pool
	return conf, nil
}
