package main

// Secured Kafka clusters (kafka_security.go) against the real Apache Kafka:
// a one-node cluster whose node also listens with SASL_SSL (PLAIN,
// SCRAM-SHA-256, SCRAM-SHA-512) and with TLS that requires a client
// certificate, its certificates made here as PEM files (Kafka's PEM key
// store) and its SCRAM credentials added when its storage is formatted
// (scripts/kafka.sh configure).

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaTestServerName is the only name in the brokers' certificate: no IP
// address, so a client must ask for it (KAFKA_TLS_SERVER_NAME).
const kafkaTestServerName = "kafka.playwatch.test"

// kafkaTestSecurity is what a secured test cluster trusts and accepts.
type kafkaTestSecurity struct {
	dir         string
	caFile      string // signs the brokers' and the client's certificates
	otherCAFile string // a CA that signed nothing of the cluster's
	clientCert  string
	clientKey   string
	user        string
	password    string // for PLAIN and both SCRAM mechanisms
}

// writeKafkaTestSecurity makes a throw-away CA, the brokers' key store (an
// RSA key, which every JDK reads from PEM) and a client certificate in dir.
func writeKafkaTestSecurity(dir string) (*kafkaTestSecurity, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	secret := make([]byte, 12)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	s := &kafkaTestSecurity{dir: dir, caFile: filepath.Join(dir, "ca.pem"), otherCAFile: filepath.Join(dir, "other-ca.pem"),
		clientCert: filepath.Join(dir, "client.pem"), clientKey: filepath.Join(dir, "client-key.pem"),
		user: "playwatch", password: hex.EncodeToString(secret)}
	ca, caKey, err := newTestCA("playwatch test CA")
	if err != nil {
		return nil, err
	}
	other, _, err := newTestCA("a CA the cluster does not use")
	if err != nil {
		return nil, err
	}
	serverKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	server, err := signTestCert(ca, caKey, &serverKey.PublicKey, &x509.Certificate{
		Subject: pkix.Name{CommonName: kafkaTestServerName}, DNSNames: []string{kafkaTestServerName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, err
	}
	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	client, err := signTestCert(ca, caKey, &clientKey.PublicKey, &x509.Certificate{
		Subject: pkix.Name{CommonName: "playwatch-client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	serverPKCS8, err := x509.MarshalPKCS8PrivateKey(serverKey)
	if err != nil {
		return nil, err
	}
	clientPKCS8, err := x509.MarshalPKCS8PrivateKey(clientKey)
	if err != nil {
		return nil, err
	}
	for name, blocks := range map[string][]*pem.Block{
		"keystore.pem":   {{Type: "PRIVATE KEY", Bytes: serverPKCS8}, certBlock(server), certBlock(ca)},
		"ca.pem":         {certBlock(ca)},
		"other-ca.pem":   {certBlock(other)},
		"client.pem":     {certBlock(client)},
		"client-key.pem": {{Type: "PRIVATE KEY", Bytes: clientPKCS8}},
	} {
		var b []byte
		for _, blk := range blocks {
			b = append(b, pem.EncodeToMemory(blk)...)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func certBlock(c *x509.Certificate) *pem.Block { return &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw} }

func newTestCA(name string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

func signTestCert(ca *x509.Certificate, caKey *ecdsa.PrivateKey, pub any, tmpl *x509.Certificate) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// scriptEnv tells scripts/kafka.sh configure where the PEM files are and
// which users to create.
func (s *kafkaTestSecurity) scriptEnv() []string {
	return []string{"PLAYWATCH_KAFKA_TLS_DIR=" + s.dir, "PLAYWATCH_KAFKA_SASL_USERS=" + s.user + ":" + s.password}
}

// apacheKafkaSecuredCluster is the binary's secured one-node cluster.
func apacheKafkaSecuredCluster(t testing.TB) *apacheKafka {
	t.Helper()
	return apacheKafkaClusterOf(t, apacheKafkaKind{nodes: 1, secured: true})
}

func loopbackAddrs(ports []int) []string {
	addrs := make([]string, len(ports))
	for i, p := range ports {
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	return addrs
}

// saslEnv is the playwatch configuration that reaches the SASL_SSL
// listener with mechanism.
func (k *apacheKafka) saslEnv(mechanism string) map[string]string {
	return map[string]string{
		"KAFKA_BROKERS":         strings.Join(loopbackAddrs(k.saslPorts), ","),
		"KAFKA_TLS":             "on",
		"KAFKA_TLS_CA_FILE":     k.secure.caFile,
		"KAFKA_TLS_SERVER_NAME": kafkaTestServerName,
		"KAFKA_SASL_MECHANISM":  mechanism,
		"KAFKA_SASL_USERNAME":   k.secure.user,
		"KAFKA_SASL_PASSWORD":   k.secure.password,
	}
}

// mtlsEnv reaches the listener that requires a client certificate.
func (k *apacheKafka) mtlsEnv() map[string]string {
	return map[string]string{
		"KAFKA_BROKERS":         strings.Join(loopbackAddrs(k.mtlsPorts), ","),
		"KAFKA_TLS":             "on",
		"KAFKA_TLS_CA_FILE":     k.secure.caFile,
		"KAFKA_TLS_SERVER_NAME": kafkaTestServerName,
		"KAFKA_TLS_CERT_FILE":   k.secure.clientCert,
		"KAFKA_TLS_KEY_FILE":    k.secure.clientKey,
	}
}

// withEnv is base with changes; an empty value removes the variable.
func withEnv(base map[string]string, changes map[string]string) map[string]string {
	env := maps.Clone(base)
	for k, v := range changes {
		if v == "" {
			delete(env, k)
		} else {
			env[k] = v
		}
	}
	return env
}

// TestApacheKafkaSecured runs its parts one after the other: they share
// the playwatch topics of one cluster, and as one test they hold one of the
// suite's parallel slots, not two.
func TestApacheKafkaSecured(t *testing.T) {
	t.Parallel()
	k := apacheKafkaSecuredCluster(t)
	t.Run("start errors", func(t *testing.T) { testKafkaSecuredStartErrors(t, k) })
	t.Run("PLAIN, SCRAM-SHA-256 and mTLS", func(t *testing.T) { testKafkaSecuredWaysIn(t, k) })
	t.Run("end to end", func(t *testing.T) { testKafkaSecuredEndToEnd(t, k) })
}

// The scenario of e2e_test.go over SASL_SSL with SCRAM-SHA-512, the
// password read from a file; then a one-off command beside a playwatch that
// runs the managed PostgreSQL, taking the brokers from its attach file and
// the credentials from its own environment.
func testKafkaSecuredEndToEnd(t *testing.T, k *apacheKafka) {
	clearPlaywatchTopics(t, k.Admin())
	passwordFile := filepath.Join(t.TempDir(), "kafka-password")
	if err := os.WriteFile(passwordFile, []byte(k.secure.password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secured := withEnv(k.saslEnv("SCRAM-SHA-512"), map[string]string{"KAFKA_SASL_PASSWORD": "", "KAFKA_SASL_PASSWORD_FILE": passwordFile})
	runEndToEnd(t, withEnv(secured, map[string]string{
		"DATABASE_URL":       newTestDatabase(t),
		"PLAYWATCH_DATA_DIR": t.TempDir(),
		"CONSUMER_GROUP":     fmt.Sprintf("playwatch-e2e-secured-%d", time.Now().UnixNano()),
	}))

	t.Run("attached command", func(t *testing.T) {
		dataDir := filepath.Join(tempDataDir(t), "data")
		replay := newReplayPlayStore(t)
		env := withEnv(secured, map[string]string{
			"PLAYWATCH_DATA_DIR":  dataDir,
			"PLAYWATCH_HTTP_ADDR": freeAddr(t),
			"PLAYSTORE_URL":       replay.URL,
			"CONSUMER_GROUP":      fmt.Sprintf("playwatch-attach-%d", time.Now().UnixNano()),
		})
		_, stop, logs := startRun(t, env, "--roles", "registry")
		defer func() {
			if err := stop(); err != nil {
				t.Errorf("run: %v\n%s", err, logs)
			}
		}()
		attach, err := os.ReadFile(filepath.Join(dataDir, attachFileName))
		if err != nil {
			t.Fatal(err)
		}
		var r runningPlaywatch
		if err := json.Unmarshal(attach, &r); err != nil {
			t.Fatal(err)
		}
		if !r.KafkaTLS || r.KafkaSASLMechanism != "SCRAM-SHA-512" || strings.Join(r.Brokers, ",") != secured["KAFKA_BROKERS"] {
			t.Errorf("attach file: kafka_tls %v, kafka_sasl_mechanism %q, brokers %v", r.KafkaTLS, r.KafkaSASLMechanism, r.Brokers)
		}
		for what, text := range map[string]string{"the attach file": string(attach), "the logs": logs.String()} {
			if strings.Contains(text, k.secure.password) {
				t.Errorf("%s hold the SASL password", what)
			}
		}

		// The command brings its own credentials, not its brokers.
		own := withEnv(env, map[string]string{"KAFKA_BROKERS": ""})
		var out, errOut syncBuffer
		if err := run(t.Context(), []string{"crawl", "--once"}, envFunc(own), &out, &errOut); err != nil {
			t.Fatalf("crawl --once with the credentials: %v\n%s", err, errOut.String())
		}
		if want := "app_stats: 0/0"; !strings.HasPrefix(out.String(), want) {
			t.Errorf("crawl --once printed %q, want %s...", out.String(), want)
		}
		bare := withEnv(own, map[string]string{"KAFKA_TLS": "", "KAFKA_TLS_CA_FILE": "", "KAFKA_TLS_SERVER_NAME": "",
			"KAFKA_SASL_MECHANISM": "", "KAFKA_SASL_USERNAME": "", "KAFKA_SASL_PASSWORD_FILE": ""})
		err = run(t.Context(), []string{"crawl", "--once"}, envFunc(bare), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), "KAFKA_TLS=on and KAFKA_SASL_MECHANISM=SCRAM-SHA-512") {
			t.Errorf("crawl --once without the credentials: %v, want an error naming KAFKA_TLS and KAFKA_SASL_MECHANISM", err)
		}
	})
}

// What fails at start says which variable to look at, and never shows the
// password.
func testKafkaSecuredStartErrors(t *testing.T, k *apacheKafka) {
	dbURL := newTestDatabase(t)
	start := func(t *testing.T, env map[string]string) (string, error) {
		t.Helper()
		env = withEnv(env, map[string]string{"DATABASE_URL": dbURL, "PLAYWATCH_DATA_DIR": t.TempDir(), "PLAYWATCH_HTTP_ADDR": freeAddr(t)})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		var logs syncBuffer
		began := time.Now()
		err := run(ctx, []string{"run"}, envFunc(env), &logs, &logs)
		t.Logf("failed after %s: %v", time.Since(began).Round(time.Millisecond), err)
		if err != nil && strings.Contains(err.Error()+logs.String(), k.secure.password) {
			t.Errorf("the error or the logs show the password")
		}
		return logs.String(), err
	}
	for _, c := range []struct {
		name string
		env  map[string]string
		want []string // in the error
	}{
		{"wrong password", withEnv(k.saslEnv("SCRAM-SHA-512"), map[string]string{"KAFKA_SASL_PASSWORD": "wrong" + k.secure.password}),
			[]string{"KAFKA_SASL_PASSWORD", `KAFKA_SASL_USERNAME="playwatch"`, "refused"}},
		{"unknown user PLAIN", withEnv(k.saslEnv("PLAIN"), map[string]string{"KAFKA_SASL_USERNAME": "nobody"}),
			[]string{"KAFKA_SASL_PASSWORD", `KAFKA_SASL_USERNAME="nobody"`}},
		{"untrusted certificate", withEnv(k.saslEnv("SCRAM-SHA-256"), map[string]string{"KAFKA_TLS_CA_FILE": k.secure.otherCAFile}),
			[]string{"KAFKA_TLS_CA_FILE=" + k.secure.otherCAFile, "not trusted", "unknown authority"}},
		{"system CAs", withEnv(k.saslEnv("SCRAM-SHA-256"), map[string]string{"KAFKA_TLS_CA_FILE": ""}),
			[]string{"system's CA certificates", "not trusted"}},
		{"name not in the certificate", withEnv(k.saslEnv("SCRAM-SHA-256"), map[string]string{"KAFKA_TLS_SERVER_NAME": ""}),
			[]string{"KAFKA_TLS_SERVER_NAME", "not valid for"}},
		{"TLS listener without TLS", map[string]string{"KAFKA_BROKERS": strings.Join(loopbackAddrs(k.saslPorts), ",")},
			[]string{"KAFKA_TLS", "KAFKA_SASL_MECHANISM"}},
		{"SASL listener without SASL", withEnv(k.saslEnv("SCRAM-SHA-256"), map[string]string{"KAFKA_SASL_MECHANISM": "", "KAFKA_SASL_USERNAME": "", "KAFKA_SASL_PASSWORD": ""}),
			[]string{"KAFKA_SASL_MECHANISM"}},
		{"plaintext listener with TLS", withEnv(k.saslEnv("SCRAM-SHA-256"), map[string]string{"KAFKA_BROKERS": strings.Join(k.Brokers(), ",")}),
			[]string{"KAFKA_TLS=on", "do not answer in TLS"}},
		{"mTLS without a client certificate", withEnv(k.mtlsEnv(), map[string]string{"KAFKA_TLS_CERT_FILE": "", "KAFKA_TLS_KEY_FILE": ""}),
			[]string{"KAFKA_TLS_CERT_FILE", "refused the TLS handshake"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs, err := start(t, c.env)
			if err == nil {
				t.Fatalf("run started:\n%s", logs)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// playwatch's own client options, through each way in: a record produced
// over it is on the topic.
func testKafkaSecuredWaysIn(t *testing.T, k *apacheKafka) {
	topic := k.TopicName(t)
	if err := k.CreateTopic(t.Context(), topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	var produced int
	for name, env := range map[string]map[string]string{
		"PLAIN": k.saslEnv("PLAIN"), "SCRAM-SHA-256": k.saslEnv("SCRAM-SHA-256"), "mTLS": k.mtlsEnv(),
	} {
		cl, err := parseCommandLine("run", "run", nil, envFunc(env), os.Stdout, os.Stderr, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		client, err := kgo.NewClient(append(kafkaClientOptions(cl.cfg.Kafka, cl.cfg.KafkaBrokers), kgo.DefaultProduceTopic(topic))...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		err = client.ProduceSync(ctx, &kgo.Record{Value: []byte(name)}).FirstErr()
		cancel()
		client.Close()
		if err != nil {
			t.Errorf("produce over %s: %v", name, err)
			continue
		}
		produced++
	}
	got := map[string]bool{}
	for _, r := range consumeAll(t, k.Brokers(), topic, produced) {
		got[string(r.Value)] = true
	}
	if len(got) != 3 || !got["PLAIN"] || !got["SCRAM-SHA-256"] || !got["mTLS"] {
		t.Errorf("on the topic: %v, want the records of PLAIN, SCRAM-SHA-256 and mTLS", got)
	}
}
