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
	"io"
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
	why, err := reusableTLSFiles(certPath, keyPath, cred, required, time.Now())
	if err != nil {
		return "", "", fmt.Errorf("read the TLS files of the managed postgres: %w", err)
	}
	if why == "" {
		return certPath, keyPath, nil
	}
	_, certErr := os.Lstat(certPath)
	_, keyErr := os.Lstat(keyPath)
	replacing := certErr == nil || keyErr == nil
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
	log := m.logger.Info
	if replacing {
		// Clients that pinned the old certificate (sslmode=verify-*) fail
		// until they get the new one.
		log = m.logger.Warn
	}
	log("made a self-signed TLS certificate for the managed postgres", "reason", why, "replaced", replacing, "cert", certPath,
		"dns_names", dns, "ip_addresses", ips, "not_after", time.Now().Add(pgTLSValidity).UTC().Format(time.RFC3339))
	return certPath, keyPath, nil
}

// reusableTLSFiles says why the certificate and key at certPath and keyPath
// cannot be used for names at now, or "" when they can; err is a failure
// to read them (EACCES, EIO), which remaking them would only hide. Only
// regular files of the server's user with mode 0600 are read: playwatch may
// run as root, and the data directory is that user's, who could swap in a
// symbolic link (to a file only root may read) or a FIFO (blocking the
// start) at any time, so each file is opened without following a link or
// waiting for a writer and checked through its descriptor.
func reusableTLSFiles(certPath, keyPath string, cred *syscall.Credential, names []string, now time.Time) (why string, err error) {
	uid := uint32(os.Geteuid())
	if cred != nil {
		uid = cred.Uid
	}
	var contents [2][]byte
	for i, p := range []string{certPath, keyPath} {
		if contents[i], why, err = readPrivateFile(p, uid); why != "" || err != nil {
			return why, err
		}
	}
	return reusableTLSContents(contents[0], contents[1], names, now), nil
}

// pgTLSMaxFile bounds what is read of a certificate or key file: both are
// well under a kilobyte.
const pgTLSMaxFile = 64 << 10

// readPrivateFile reads path if it is a regular file of uid with mode 0600;
// why says what it is instead.
func readPrivateFile(path string, uid uint32) (content []byte, why string, err error) {
	name := filepath.Base(path)
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, "missing " + name, nil
	case errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.EMLINK):
		// O_NOFOLLOW on a symbolic link: ELOOP (Linux, macOS), EMLINK (FreeBSD).
		return nil, name + " is a symbolic link", nil
	case errors.Is(err, syscall.ENXIO):
		// A socket, or a FIFO or device without its other end.
		return nil, name + " is not a regular file", nil
	case err != nil:
		return nil, "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, "", err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 || !ok || st.Uid != uid {
		return nil, name + " is not a file of mode 0600 of the server's OS user", nil
	}
	if content, err = io.ReadAll(io.LimitReader(f, pgTLSMaxFile+1)); err != nil {
		return nil, "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(content) > pgTLSMaxFile {
		return nil, name + " is larger than a certificate or key", nil
	}
	return content, "", nil
}

// reusableTLSContents says why the PEM certificate and key cannot be used
// for names at now, or "" when they can.
func reusableTLSContents(certPEM, keyPEM []byte, names []string, now time.Time) string {
	block, _ := pem.Decode(certPEM)
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
	block, _ = pem.Decode(keyPEM)
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
