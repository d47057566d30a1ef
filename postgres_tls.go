package main

// The managed cluster's TCP listener speaks TLS with a self-signed
// certificate playwatch makes in the cluster's data directory: clients on
// other hosts must use it (hostssl in pg_hba.conf), so their passwords and
// rows do not cross the network in clear. The certificate is made at the
// first start with a TCP listener and reused until it is missing, expiring
// or no longer names the listen address and the host.

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

const (
	pgTLSCertFile = "server.crt"
	pgTLSKeyFile  = "server.key"
	// pgTLSValidity is how long a new certificate is valid; one that expires
	// within pgTLSRenewBefore is replaced at the next start.
	pgTLSValidity    = 2 * 365 * 24 * time.Hour
	pgTLSRenewBefore = 30 * 24 * time.Hour
)

// pgTLSNames are the names the certificate of a cluster listening on listen
// must hold: the listen host (every address of the machine for a wildcard
// listen) and the machine's host name. required are those whose absence
// makes an existing certificate stale; the machine's addresses on a
// wildcard listen come and go (DHCP, containers), so they are not.
func pgTLSNames(listen string) (dns []string, ips []net.IP, required []string) {
	host, _, _ := net.SplitHostPort(listen)
	ip := net.ParseIP(host)
	switch {
	case host == "" || (ip != nil && ip.IsUnspecified()):
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
					ips = append(ips, n.IP)
				}
			}
		}
	case ip != nil:
		ips = append(ips, ip)
		required = append(required, ip.String())
	default:
		dns = append(dns, host)
		required = append(required, host)
	}
	if name, err := os.Hostname(); err == nil && name != "" && !slices.Contains(dns, name) {
		dns = append(dns, name)
		required = append(required, name)
	}
	return dns, ips, required
}

// ensureTLSFiles makes sure the data directory holds a usable certificate
// and key for listen, owned by the server's OS user (cred, or playwatch's
// own user) with mode 0600, and returns their paths.
func (m *managedPostgres) ensureTLSFiles(cred *syscall.Credential) (certPath, keyPath string, err error) {
	certPath = filepath.Join(m.opts.DataDir, pgTLSCertFile)
	keyPath = filepath.Join(m.opts.DataDir, pgTLSKeyFile)
	dns, ips, required := pgTLSNames(m.opts.Listen)
	why := reusableTLSFiles(certPath, keyPath, cred, required, time.Now())
	if why == "" {
		return certPath, keyPath, nil
	}
	certPEM, keyPEM, err := newSelfSignedCert(dns, ips, time.Now())
	if err != nil {
		return "", "", fmt.Errorf("make the TLS certificate of the managed postgres: %w", err)
	}
	// The key first: a certificate is never left beside a key of another one.
	if err := writeFileAtomic(keyPath, keyPEM, 0o600, cred); err != nil {
		return "", "", fmt.Errorf("write %s: %w", keyPath, err)
	}
	if err := writeFileAtomic(certPath, certPEM, 0o600, cred); err != nil {
		return "", "", fmt.Errorf("write %s: %w", certPath, err)
	}
	m.logger.Info("made a self-signed TLS certificate for the managed postgres", "reason", why, "cert", certPath,
		"dns_names", dns, "ip_addresses", ips, "not_after", time.Now().Add(pgTLSValidity).UTC().Format(time.RFC3339))
	return certPath, keyPath, nil
}

// reusableTLSFiles says why the certificate and key at certPath and keyPath
// cannot be used for names at now, or "" when they can. Only regular files
// of the server's user with mode 0600 are read: playwatch may run as root,
// and the data directory is that user's.
func reusableTLSFiles(certPath, keyPath string, cred *syscall.Credential, names []string, now time.Time) string {
	uid := uint32(os.Geteuid())
	if cred != nil {
		uid = cred.Uid
	}
	var contents [2][]byte
	for i, p := range []string{certPath, keyPath} {
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return "missing " + filepath.Base(p)
		}
		if err != nil {
			return err.Error()
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != uid {
			return filepath.Base(p) + " is not a file of mode 0600 of the server's OS user"
		}
		if contents[i], err = os.ReadFile(p); err != nil {
			return err.Error()
		}
	}
	block, _ := pem.Decode(contents[0])
	if block == nil || block.Type != "CERTIFICATE" {
		return pgTLSCertFile + " holds no PEM certificate"
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return pgTLSCertFile + ": " + err.Error()
	}
	if now.Add(pgTLSRenewBefore).After(cert.NotAfter) {
		return "the certificate expires at " + cert.NotAfter.UTC().Format(time.RFC3339)
	}
	for _, n := range names {
		if cert.VerifyHostname(n) != nil {
			return "the certificate does not name " + n
		}
	}
	block, _ = pem.Decode(contents[1])
	if block == nil {
		return pgTLSKeyFile + " holds no PEM key"
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return pgTLSKeyFile + ": " + err.Error()
	}
	if k, ok := key.(crypto.Signer); !ok || !publicKeysEqual(k.Public(), cert.PublicKey) {
		return "the key is not the certificate's"
	}
	return ""
}

func publicKeysEqual(a, b any) bool {
	ka, err1 := x509.MarshalPKIXPublicKey(a)
	kb, err2 := x509.MarshalPKIXPublicKey(b)
	return err1 == nil && err2 == nil && bytes.Equal(ka, kb)
}

// newSelfSignedCert makes an ECDSA P-256 key and a self-signed server
// certificate for the names, valid from now (less an hour of clock skew)
// for pgTLSValidity, both PEM-encoded.
func newSelfSignedCert(dns []string, ips []net.IP, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	cn := "playwatch managed PostgreSQL"
	if len(dns) > 0 {
		cn += " " + dns[len(dns)-1]
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(pgTLSValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              dns,
		IPAddresses:           ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}
