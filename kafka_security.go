package main

// Secured Kafka clusters (README "Secured Kafka clusters"): TLS, optionally
// with a client certificate, and SASL, for every Kafka client playwatch
// opens. kafkaClientOptions is the one place their options are built.

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// kafkaSecurity is how playwatch authenticates to the brokers of
// KAFKA_BROKERS, from the KAFKA_TLS* and KAFKA_SASL_* variables.
type kafkaSecurity struct {
	TLS               bool
	CAFile            string
	CertFile, KeyFile string
	ServerName        string
	SASLMechanism     string // "" (none), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
	SASLUsername      string
	SASLPassword      string // never logged, never written to the attach file
	UsernameFile      string
	PasswordFile      string
	passwordFromFile  bool
	tlsConfig         *tls.Config // built by finish; nil without KAFKA_TLS
}

// saslMechanisms are the values of KAFKA_SASL_MECHANISM.
var saslMechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}

// finish checks the KAFKA_TLS* and KAFKA_SASL_* settings together, reads
// the files they name and builds the TLS configuration, so that a wrong
// path or a bad certificate fails at start. Errors name the variables.
func (s *kafkaSecurity) finish() error {
	var given []string
	for _, v := range []struct {
		name, val string
	}{{"KAFKA_TLS_CA_FILE", s.CAFile}, {"KAFKA_TLS_CERT_FILE", s.CertFile}, {"KAFKA_TLS_KEY_FILE", s.KeyFile}, {"KAFKA_TLS_SERVER_NAME", s.ServerName}} {
		if v.val != "" {
			given = append(given, v.name)
		}
	}
	if !s.TLS && len(given) > 0 {
		return fmt.Errorf("%s set but KAFKA_TLS is off: set KAFKA_TLS=on to use TLS", strings.Join(given, ", "))
	}
	if (s.CertFile == "") != (s.KeyFile == "") {
		return errors.New("KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE go together (a client certificate and its key, for mTLS): set both or neither")
	}
	var err error
	if s.SASLUsername, _, err = valueOrFile("KAFKA_SASL_USERNAME", s.SASLUsername, s.UsernameFile); err != nil {
		return err
	}
	if s.SASLPassword, s.passwordFromFile, err = valueOrFile("KAFKA_SASL_PASSWORD", s.SASLPassword, s.PasswordFile); err != nil {
		return err
	}
	switch {
	case s.SASLMechanism == "" && (s.SASLUsername != "" || s.SASLPassword != ""):
		return fmt.Errorf("KAFKA_SASL_USERNAME or KAFKA_SASL_PASSWORD set but KAFKA_SASL_MECHANISM is empty: set it to one of %s", strings.Join(saslMechanisms, ", "))
	case s.SASLMechanism != "" && s.SASLUsername == "":
		return fmt.Errorf("KAFKA_SASL_MECHANISM=%s needs KAFKA_SASL_USERNAME (or KAFKA_SASL_USERNAME_FILE)", s.SASLMechanism)
	case s.SASLMechanism != "" && s.SASLPassword == "":
		return fmt.Errorf("KAFKA_SASL_MECHANISM=%s needs KAFKA_SASL_PASSWORD (or KAFKA_SASL_PASSWORD_FILE)", s.SASLMechanism)
	case s.SASLMechanism == "PLAIN" && !s.TLS:
		return errors.New("KAFKA_SASL_MECHANISM=PLAIN sends the password as it is: it needs KAFKA_TLS=on (or a SCRAM mechanism)")
	}
	if !s.TLS {
		return nil
	}
	s.tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.ServerName}
	if s.CAFile != "" {
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			return fmt.Errorf("KAFKA_TLS_CA_FILE: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("KAFKA_TLS_CA_FILE=%s holds no PEM certificate", s.CAFile)
		}
		s.tlsConfig.RootCAs = pool
	}
	if s.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
		if err != nil {
			return fmt.Errorf("KAFKA_TLS_CERT_FILE=%s and KAFKA_TLS_KEY_FILE=%s: %w", s.CertFile, s.KeyFile, err)
		}
		s.tlsConfig.Certificates = []tls.Certificate{cert}
	}
	return nil
}

// valueOrFile is a credential given as NAME or in the file NAME_FILE (one
// line; its line break is not part of it), never both.
func valueOrFile(name, value, file string) (string, bool, error) {
	if file == "" {
		return value, false, nil
	}
	if value != "" {
		return "", false, fmt.Errorf("%s and %s_FILE are both set: set one", name, name)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", false, fmt.Errorf("%s_FILE: %w", name, err)
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if v == "" {
		return "", false, fmt.Errorf("%s_FILE=%s is empty", name, file)
	}
	return v, true, nil
}

// kafkaClientOptions are the options every Kafka client of playwatch
// starts from: the seed brokers, and the TLS and SASL of cfg.
func kafkaClientOptions(s kafkaSecurity, brokers []string) []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	if s.tlsConfig != nil {
		// franz-go clones it per dial and fills ServerName from the broker's
		// host when KAFKA_TLS_SERVER_NAME leaves it empty.
		opts = append(opts, kgo.DialTLSConfig(s.tlsConfig))
	}
	user, pass := s.SASLUsername, s.SASLPassword
	switch s.SASLMechanism {
	case "PLAIN":
		opts = append(opts, kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
	}
	return opts
}

// checkEmbeddedBroker refuses TLS and SASL on the embedded broker, which
// listens on loopback and speaks neither: the settings must not look like
// they protect something.
func (s kafkaSecurity) checkEmbeddedBroker() error {
	switch {
	case s.TLS:
		return errors.New("KAFKA_TLS=on needs KAFKA_BROKERS: the embedded broker listens on loopback without TLS")
	case s.SASLMechanism != "":
		return fmt.Errorf("KAFKA_SASL_MECHANISM=%s needs KAFKA_BROKERS: the embedded broker listens on loopback without SASL", s.SASLMechanism)
	}
	return nil
}

// checkAttached makes sure a one-off command that takes its brokers from
// the running playwatch reaches them the same way: the credentials are
// never written to the data directory, so they come from the command's
// own environment.
func (s kafkaSecurity) checkAttached(r runningPlaywatch) error {
	if s.TLS == r.KafkaTLS && s.SASLMechanism == r.KafkaSASLMechanism {
		return nil
	}
	want := func(tlsOn bool, mech string) string {
		w := "KAFKA_TLS=off"
		if tlsOn {
			w = "KAFKA_TLS=on"
		}
		if mech == "" {
			return w + " and no KAFKA_SASL_MECHANISM"
		}
		return w + " and KAFKA_SASL_MECHANISM=" + mech
	}
	return fmt.Errorf("the playwatch that runs on the data directory reaches its brokers %v with %s, this command has %s: give it the same KAFKA_TLS* and KAFKA_SASL_* variables (credentials are never written to the data directory)",
		r.Brokers, want(r.KafkaTLS, r.KafkaSASLMechanism), want(s.TLS, s.SASLMechanism))
}

// explainKafkaError makes the first failure to reach the brokers say which
// variable to look at: a refused password, an untrusted certificate, or a
// TLS or SASL listener talked to without them.
func (s kafkaSecurity) explainKafkaError(err error) error {
	var (
		unknownCA  x509.UnknownAuthorityError
		hostname   x509.HostnameError
		verify     *tls.CertificateVerificationError
		notTLS     tls.RecordHeaderError
		firstRead  *kgo.ErrFirstReadEOF
		credSource = "KAFKA_SASL_PASSWORD"
	)
	if s.passwordFromFile {
		credSource = "KAFKA_SASL_PASSWORD_FILE=" + s.PasswordFile
	}
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return fmt.Errorf("the brokers refused KAFKA_SASL_USERNAME=%q with the password of %s (KAFKA_SASL_MECHANISM=%s): %w", s.SASLUsername, credSource, s.SASLMechanism, err)
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return fmt.Errorf("the brokers do not offer KAFKA_SASL_MECHANISM=%s: %w", s.SASLMechanism, err)
	case errors.As(err, &hostname):
		return fmt.Errorf("KAFKA_TLS: the brokers' certificate is not valid for the name asked for (KAFKA_TLS_SERVER_NAME=%q, empty: the broker's host): %w", s.ServerName, err)
	case errors.As(err, &unknownCA), errors.As(err, &verify):
		trust := "the system's CA certificates"
		if s.CAFile != "" {
			trust = "KAFKA_TLS_CA_FILE=" + s.CAFile
		}
		return fmt.Errorf("KAFKA_TLS: the brokers' certificate is not trusted: it is not signed by a CA of %s: %w", trust, err)
	case errors.As(err, &notTLS), s.TLS && errors.As(err, &firstRead) && strings.Contains(firstRead.Error(), "after a dial"):
		return fmt.Errorf("KAFKA_TLS=on but the brokers do not answer in TLS (a plaintext listener in KAFKA_BROKERS?): %w", err)
	case strings.Contains(err.Error(), "remote error: tls:"):
		return fmt.Errorf("KAFKA_TLS: the brokers refused the TLS handshake (with mTLS: KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE): %w", err)
	case !s.TLS && (strings.Contains(err.Error(), "speaking to a tls endpoint") || errors.As(err, &firstRead) && strings.Contains(firstRead.Error(), "api versions")):
		return fmt.Errorf("the brokers of KAFKA_BROKERS expect TLS: set KAFKA_TLS=on (and KAFKA_SASL_MECHANISM if they ask for SASL): %w", err)
	case s.SASLMechanism == "" && errors.As(err, &firstRead):
		return fmt.Errorf("the brokers closed the connection after the first request: a SASL listener needs KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD: %w", err)
	}
	return err
}
