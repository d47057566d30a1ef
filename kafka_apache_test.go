package main

// A real Apache Kafka (KRaft, combined broker+controller nodes) as a test
// engine. The JVMs start at most once per test binary and node count, listen
// on loopback ports picked at run time, and die with the test binary.
//
// Use:
//
//	k := apacheKafkaCluster(t, 1)          // or 3; skips when Java or the jars are missing
//	k := apacheKafkaSecuredCluster(t)      // one node, also with SASL_SSL and mTLS listeners
//	topic := k.TopicName(t)                // clusters are shared by all tests of the binary
//	err := k.CreateTopic(ctx, topic, 3, 1, nil)
//	cl := k.Client(t, kgo.ConsumeTopics(topic))
//	leader, _ := k.PartitionLeader(ctx, topic, 0)
//	k.KillNode(ctx, leader)                // SIGKILL; StopNode is graceful; StartNode brings it back
//
// A test that stops or kills nodes must not run in parallel with other tests
// of the same cluster; the next apacheKafkaCluster call restarts what it left
// down.
//
// scripts/kafka.sh owns the broker configuration and the JVM flags; this file
// only picks ports, starts the processes and watches them.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const (
	// apacheKafkaStartTimeout bounds formatting plus the first start of every
	// node: three JVMs take about 15 s on two idle cores, and minutes when
	// other developers load the same machine.
	apacheKafkaStartTimeout = 4 * time.Minute
	// apacheKafkaStopGrace is how long a node may take to shut down cleanly
	// before it is killed.
	apacheKafkaStopGrace = 20 * time.Second
)

// apacheKafkaClusters is the once-per-binary registry of started clusters,
// keyed by node count and whether they are secured. It is the only
// package-level mutable state.
var apacheKafkaClusters = struct {
	mu      sync.Mutex
	byNodes map[apacheKafkaKind]*apacheKafkaStart
}{byNodes: map[apacheKafkaKind]*apacheKafkaStart{}}

// apacheKafkaKind tells the clusters of a binary apart.
type apacheKafkaKind struct {
	nodes int
	// secured: each node also has a SASL_SSL and an mTLS listener
	// (kafka_secured_test.go).
	secured bool
}

// apacheKafkaStart remembers the outcome of the one start attempt per node
// count, so that a failed start fails every later test at once.
type apacheKafkaStart struct {
	once     sync.Once
	cluster  *apacheKafka
	err      error
	duration time.Duration
}

// apacheKafka is one running cluster. Node ids are 1..N, the same ids Kafka
// reports as partition leaders.
type apacheKafka struct {
	dir      string   // node-ID/ directories with config, data and server.log
	lock     *os.File // flock held while this binary owns dir
	script   string   // absolute path of scripts/kafka.sh
	env      []string
	ports    []int // client port of node i+1
	admin    *kadm.Client
	adminRaw *kgo.Client

	restoreMu sync.Mutex // one startStoppedNodes at a time

	mu      sync.Mutex
	running map[int32]*apacheKafkaNode

	// Of a secured cluster only: the client ports of its SASL_SSL and mTLS
	// listeners, and the certificates and users they accept.
	saslPorts, mtlsPorts []int
	secure               *kafkaTestSecurity
}

// apacheKafkaNode is one JVM process of a node.
type apacheKafkaNode struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been reaped
}

// apacheKafkaLibsDir is where scripts/kafka.sh fetch puts the jars.
func apacheKafkaLibsDir() (string, error) {
	if dir := os.Getenv("PLAYWATCH_KAFKA_LIBS"); dir != "" {
		return filepath.Abs(dir)
	}
	return filepath.Abs(filepath.Join(".cache", "kafka", "libs"))
}

// apacheKafkaUnavailable says why Apache Kafka cannot run here, or "".
func apacheKafkaUnavailable() string {
	if _, err := exec.LookPath("java"); err != nil {
		return "java is not on PATH (Java 17+ is needed)"
	}
	libs, err := apacheKafkaLibsDir()
	if err != nil {
		return err.Error()
	}
	if jars, _ := filepath.Glob(filepath.Join(libs, "kafka_2.13-*.jar")); len(jars) == 0 {
		return "no Kafka jars in " + libs + ": run `make kafka-jars` or `scripts/kafka.sh fetch`"
	}
	return ""
}

// apacheKafkaCluster returns the binary's cluster of the given number of
// nodes (1 or 3), starting it on first use. It skips the test when Java or the jars are
// missing, except under CI=true, where a missing engine is a failure. Every
// node that an earlier test left stopped is started again first.
func apacheKafkaCluster(t testing.TB, nodes int) *apacheKafka {
	t.Helper()
	return apacheKafkaClusterOf(t, apacheKafkaKind{nodes: nodes})
}

func apacheKafkaClusterOf(t testing.TB, kind apacheKafkaKind) *apacheKafka {
	t.Helper()
	nodes := kind.nodes
	if why := apacheKafkaUnavailable(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Apache Kafka is required under CI=true: %s", why)
		}
		t.Skipf("Apache Kafka test engine unavailable: %s", why)
	}

	apacheKafkaClusters.mu.Lock()
	start := apacheKafkaClusters.byNodes[kind]
	if start == nil {
		start = &apacheKafkaStart{}
		apacheKafkaClusters.byNodes[kind] = start
	}
	apacheKafkaClusters.mu.Unlock()

	started := false
	start.once.Do(func() {
		started = true
		// The cluster outlives the test that starts it, so it gets its own
		// deadline instead of the test's.
		ctx, cancel := context.WithTimeout(context.Background(), apacheKafkaStartTimeout)
		defer cancel()
		begin := time.Now()
		start.cluster, start.err = startApacheKafka(ctx, kind)
		start.duration = time.Since(begin)
	})
	if start.err != nil {
		t.Fatalf("start Apache Kafka with %d node(s): %v", nodes, start.err)
	}
	if started {
		t.Logf("Apache Kafka: %d node(s) started in %s, brokers %v, files in %s",
			nodes, start.duration.Round(time.Millisecond), start.cluster.Brokers(), start.cluster.dir)
	}

	ctx, cancel := context.WithTimeout(context.Background(), apacheKafkaStartTimeout)
	defer cancel()
	if err := start.cluster.startStoppedNodes(ctx); err != nil {
		t.Fatalf("restore Apache Kafka nodes: %v", err)
	}
	return start.cluster
}

// stopApacheKafkaClusters stops every cluster this binary started and removes
// its files (kept when PLAYWATCH_KAFKA_KEEP=1). TestMain calls it after the
// tests; if the binary dies first, Pdeathsig still kills the JVMs.
func stopApacheKafkaClusters() {
	apacheKafkaClusters.mu.Lock()
	starts := make([]*apacheKafkaStart, 0, len(apacheKafkaClusters.byNodes))
	for _, s := range apacheKafkaClusters.byNodes {
		starts = append(starts, s)
	}
	clear(apacheKafkaClusters.byNodes)
	apacheKafkaClusters.mu.Unlock()

	var wg sync.WaitGroup
	for _, s := range starts {
		if s.cluster == nil {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*apacheKafkaStopGrace)
			defer cancel()
			if err := s.cluster.close(ctx); err != nil {
				fmt.Fprintf(os.Stderr, "stop Apache Kafka in %s: %v\n", s.cluster.dir, err)
			}
		})
	}
	wg.Wait()
}

// startApacheKafka configures, formats and starts a fresh cluster in a new
// temporary directory, and returns once every node is a registered broker.
func startApacheKafka(ctx context.Context, kind apacheKafkaKind) (*apacheKafka, error) {
	nodes := kind.nodes
	if nodes != 1 && nodes != 3 {
		return nil, fmt.Errorf("node count must be 1 or 3, got %d", nodes)
	}
	script, err := filepath.Abs(filepath.Join("scripts", "kafka.sh"))
	if err != nil {
		return nil, fmt.Errorf("locate scripts/kafka.sh: %w", err)
	}
	libs, err := apacheKafkaLibsDir()
	if err != nil {
		return nil, fmt.Errorf("locate Kafka jars: %w", err)
	}
	removeStaleApacheKafkaDirs()
	dir, err := os.MkdirTemp("", apacheKafkaDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create Kafka directory: %w", err)
	}
	lock, err := lockApacheKafkaDir(dir, syscall.LOCK_EX)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	listeners := 2
	if kind.secured {
		listeners = 4
	}
	ports, err := freeLoopbackPortList(listeners * nodes)
	if err != nil {
		lock.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	k := &apacheKafka{
		dir:     dir,
		lock:    lock,
		script:  script,
		env:     append(os.Environ(), "PLAYWATCH_KAFKA_LIBS="+libs),
		ports:   ports[:nodes],
		running: map[int32]*apacheKafkaNode{},
	}
	args := []string{"configure", dir, joinPorts(ports[:nodes]), joinPorts(ports[nodes : 2*nodes])}
	if kind.secured {
		k.saslPorts, k.mtlsPorts = ports[2*nodes:3*nodes], ports[3*nodes:]
		if k.secure, err = writeKafkaTestSecurity(filepath.Join(dir, "tls")); err != nil {
			k.close(context.WithoutCancel(ctx))
			return nil, err
		}
		k.env = append(k.env, k.secure.scriptEnv()...)
		args = append(args, joinPorts(k.saslPorts), joinPorts(k.mtlsPorts))
	}
	if err := k.runScript(ctx, args...); err != nil {
		k.close(context.WithoutCancel(ctx))
		return nil, err
	}
	k.adminRaw, err = kgo.NewClient(kgo.SeedBrokers(k.Brokers()...))
	if err != nil {
		k.close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("admin client: %w", err)
	}
	k.admin = kadm.NewClient(k.adminRaw)

	for id := range int32(nodes) {
		if err := k.launch(id + 1); err != nil {
			k.close(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	for id := range int32(nodes) {
		if err := k.waitNode(ctx, id+1); err != nil {
			k.close(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	if err := k.waitBrokers(ctx, nodes); err != nil {
		k.close(context.WithoutCancel(ctx))
		return nil, err
	}
	return k, nil
}

const apacheKafkaDirPrefix = "playwatch-kafka-"

// lockApacheKafkaDir takes a flock on dir/lock. The kernel drops it when the
// owning binary dies however it dies, which tells a stale directory from one
// that a concurrent test run (maybe another developer's) still uses.
func lockApacheKafkaDir(dir string, how int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}

// removeStaleApacheKafkaDirs removes the directories of test binaries that
// died before they could clean up (panic, timeout, SIGKILL); their JVMs died
// with them through Pdeathsig. Failures only leave files behind.
func removeStaleApacheKafkaDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), apacheKafkaDirPrefix+"*"))
	for _, dir := range dirs {
		// A brand-new directory may not hold its lock yet.
		if info, err := os.Stat(dir); err != nil || time.Since(info.ModTime()) < time.Minute {
			continue
		}
		lock, err := lockApacheKafkaDir(dir, syscall.LOCK_EX|syscall.LOCK_NB)
		if err != nil {
			continue // in use, or not ours to judge
		}
		if os.Getenv("PLAYWATCH_KAFKA_KEEP") != "1" {
			os.RemoveAll(dir)
		}
		lock.Close()
	}
}

// freeLoopbackPortList is n distinct free ports (freeLoopbackPort). They
// are free when picked; a clash when Kafka binds them fails loudly.
func freeLoopbackPortList(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		p, err := freeLoopbackPort()
		if err != nil {
			return nil, fmt.Errorf("pick a free loopback port: %w", err)
		}
		ports = append(ports, p)
	}
	return ports, nil
}

func joinPorts(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// runScript runs one scripts/kafka.sh subcommand and returns its output in
// the error when it fails.
func (k *apacheKafka) runScript(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "bash", append([]string{k.script}, args...)...)
	cmd.Env = k.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("scripts/kafka.sh %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Brokers returns the bootstrap addresses of all nodes, running or not.
func (k *apacheKafka) Brokers() []string {
	addrs := make([]string, len(k.ports))
	for i, p := range k.ports {
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	return addrs
}

// Admin returns the cluster's shared admin client; do not close it.
func (k *apacheKafka) Admin() *kadm.Client { return k.admin }

// Client returns a franz-go client seeded with every node, closed when the
// test ends.
func (k *apacheKafka) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.Brokers()...)}, opts...)...)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TopicName returns a topic name unique to this test and run, since all tests
// of a binary share a cluster.
func (k *apacheKafka) TopicName(t testing.TB) string {
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, t.Name())
	return fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
}

// launch starts the JVM of node id. The script execs java, so the child is
// the JVM itself: it leads its own process group and gets SIGKILL when this
// test binary dies (Pdeathsig), even on a panic or a test timeout.
func (k *apacheKafka) launch(id int32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if node, ok := k.running[id]; ok && node.alive() {
		return fmt.Errorf("node %d is already running", id)
	}
	nodeDir := filepath.Join(k.dir, fmt.Sprintf("node-%d", id))
	// A fresh server.log lets wait-node see only this start.
	if err := os.Rename(filepath.Join(nodeDir, "server.log"),
		filepath.Join(nodeDir, fmt.Sprintf("server.log.%d", time.Now().UnixNano()))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("rotate node %d log: %w", id, err)
	}
	out, err := os.Create(filepath.Join(nodeDir, "stdout.log"))
	if err != nil {
		return fmt.Errorf("node %d stdout: %w", id, err)
	}
	defer out.Close() // the child keeps its own descriptor

	// Not CommandContext: the node must outlive the context of the call
	// that starts it.
	cmd := exec.Command("bash", k.script, "run-node", k.dir, strconv.Itoa(int(id)))
	cmd.Env = k.env
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = childProcAttr(true)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start node %d: %w", id, err)
	}
	node := &apacheKafkaNode{cmd: cmd, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(node.exited)
	}()
	k.running[id] = node
	// The pid file lets `scripts/kafka.sh status|stop DIR` see this node too.
	pidFile := filepath.Join(nodeDir, "pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", pidFile, err)
	}
	return nil
}

// waitNode waits until node id logs that it started and accepts connections.
func (k *apacheKafka) waitNode(ctx context.Context, id int32) error {
	timeout := apacheKafkaStartTimeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = time.Until(deadline)
	}
	secs := max(1, int(timeout/time.Second))
	if err := k.runScript(ctx, "wait-node", k.dir, strconv.Itoa(int(id)), strconv.Itoa(secs)); err != nil {
		// The directory may be gone by the time someone reads the error.
		nodeDir := filepath.Join(k.dir, fmt.Sprintf("node-%d", id))
		return fmt.Errorf("%w\nserver.log ends:\n%s\nstdout.log ends:\n%s", err,
			fileTail(filepath.Join(nodeDir, "server.log"), 20), fileTail(filepath.Join(nodeDir, "stdout.log"), 20))
	}
	return nil
}

// fileTail returns the last n lines of a file, or why it cannot.
func fileTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// waitBrokers waits until the metadata lists want registered brokers, which
// KRaft does only once they are unfenced.
func (k *apacheKafka) waitBrokers(ctx context.Context, want int) error {
	var last error
	for {
		brokers, err := k.admin.ListBrokers(ctx)
		if err == nil && len(brokers) == want {
			return nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("%d of %d brokers registered", len(brokers), want)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d brokers: %w (last: %v)", want, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// alive reports whether the node's JVM has not exited.
func (n *apacheKafkaNode) alive() bool { return !isClosed(n.exited) }

// liveNodes returns the ids of the nodes whose JVM runs, in order.
func (k *apacheKafka) liveNodes() []int32 {
	k.mu.Lock()
	defer k.mu.Unlock()
	var ids []int32
	for id, node := range k.running {
		if node.alive() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// StartNode starts a stopped or killed node and waits until the cluster
// lists it as a broker again.
func (k *apacheKafka) StartNode(ctx context.Context, id int32) error {
	if err := k.launch(id); err != nil {
		return err
	}
	if err := k.waitNode(ctx, id); err != nil {
		return err
	}
	return k.waitBrokers(ctx, len(k.liveNodes()))
}

// startStoppedNodes brings every node back that a test left down.
func (k *apacheKafka) startStoppedNodes(ctx context.Context) error {
	k.restoreMu.Lock()
	defer k.restoreMu.Unlock()
	live := k.liveNodes()
	for id := int32(1); id <= int32(len(k.ports)); id++ {
		if !slices.Contains(live, id) {
			if err := k.StartNode(ctx, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// StopNode shuts node id down cleanly (SIGTERM), killing it if it takes
// longer than the grace period or ctx.
func (k *apacheKafka) StopNode(ctx context.Context, id int32) error {
	return k.signalNode(ctx, id, syscall.SIGTERM)
}

// KillNode kills node id at once (SIGKILL), as a crash would.
func (k *apacheKafka) KillNode(ctx context.Context, id int32) error {
	return k.signalNode(ctx, id, syscall.SIGKILL)
}

func (k *apacheKafka) signalNode(ctx context.Context, id int32, sig syscall.Signal) error {
	k.mu.Lock()
	node, ok := k.running[id]
	k.mu.Unlock()
	if !ok {
		return fmt.Errorf("node %d is not running", id)
	}
	pgid := node.cmd.Process.Pid
	// Once reaped, the pid may belong to someone else: never signal it then.
	if node.alive() {
		if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal node %d: %w", id, err)
		}
	}
	grace := time.NewTimer(apacheKafkaStopGrace)
	defer grace.Stop()
	var err error
	select {
	case <-node.exited:
	case <-grace.C:
		err = fmt.Errorf("node %d ignored %v for %s; killed", id, sig, apacheKafkaStopGrace)
	case <-ctx.Done():
		err = fmt.Errorf("stop node %d: %w; killed", id, ctx.Err())
	}
	if err != nil && node.alive() {
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-node.exited
	}
	k.mu.Lock()
	delete(k.running, id)
	k.mu.Unlock()
	os.Remove(filepath.Join(k.dir, fmt.Sprintf("node-%d", id), "pid"))
	return err
}

// CreateTopic creates topic and waits until every running node serves its
// metadata with a leader for each partition: the create call returns once the
// controller has committed the topic, and brokers learn of it a moment later.
func (k *apacheKafka) CreateTopic(ctx context.Context, topic string, partitions int32, replicationFactor int16, configs map[string]*string) error {
	if _, err := k.admin.CreateTopic(ctx, partitions, replicationFactor, configs, topic); err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	for _, id := range k.liveNodes() {
		if err := k.waitTopicOnNode(ctx, id, topic, partitions); err != nil {
			return err
		}
	}
	return nil
}

// waitTopicOnNode asks node id itself, not any broker, for the topic's metadata.
func (k *apacheKafka) waitTopicOnNode(ctx context.Context, id int32, topic string, partitions int32) error {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	for {
		resp, err := req.RequestWith(ctx, k.adminRaw.Broker(int(id)))
		if err == nil {
			if err = topicServed(resp, topic, partitions); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for node %d to serve topic %s: %w (last: %v)", id, topic, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// topicServed reports why a metadata response does not yet show topic with
// a leader for each of its partitions.
func topicServed(resp *kmsg.MetadataResponse, topic string, partitions int32) error {
	if len(resp.Topics) != 1 {
		return fmt.Errorf("%d topics in the metadata response", len(resp.Topics))
	}
	t := resp.Topics[0]
	if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
		return fmt.Errorf("topic %s: %w", topic, err)
	}
	if int32(len(t.Partitions)) != partitions {
		return fmt.Errorf("topic %s has %d of %d partitions", topic, len(t.Partitions), partitions)
	}
	for _, p := range t.Partitions {
		if err := kerr.ErrorForCode(p.ErrorCode); err != nil || p.Leader < 0 {
			return fmt.Errorf("partition %s/%d: leader %d, %v", topic, p.Partition, p.Leader, err)
		}
	}
	return nil
}

// PartitionLeader returns the node that leads topic/partition according to
// the metadata, or -1 while the partition has no leader.
func (k *apacheKafka) PartitionLeader(ctx context.Context, topic string, partition int32) (int32, error) {
	detail, err := k.partitionDetail(ctx, topic, partition)
	if err != nil {
		return -1, err
	}
	return detail.Leader, nil
}

func (k *apacheKafka) partitionDetail(ctx context.Context, topic string, partition int32) (kadm.PartitionDetail, error) {
	md, err := k.admin.Metadata(ctx, topic)
	if err != nil {
		return kadm.PartitionDetail{}, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil {
		return kadm.PartitionDetail{}, fmt.Errorf("metadata of %s: topic missing (%v)", topic, td.Err)
	}
	pd, ok := td.Partitions[partition]
	if !ok {
		return kadm.PartitionDetail{}, fmt.Errorf("metadata of %s: partition %d missing", topic, partition)
	}
	return pd, nil
}

// WaitForLeader polls the metadata until topic/partition has a leader other
// than not (pass -1 to accept any leader) and returns it.
func (k *apacheKafka) WaitForLeader(ctx context.Context, topic string, partition, not int32) (int32, error) {
	var last error
	for {
		leader, err := k.PartitionLeader(ctx, topic, partition)
		if err == nil && leader >= 0 && leader != not {
			return leader, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("wait for a leader of %s/%d other than %d: %w (last: %v)", topic, partition, not, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitForISR polls the metadata until node is in the in-sync replicas of
// topic/partition.
func (k *apacheKafka) WaitForISR(ctx context.Context, topic string, partition, node int32) error {
	for {
		pd, err := k.partitionDetail(ctx, topic, partition)
		if err == nil && slices.Contains(pd.ISR, node) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for node %d in the ISR of %s/%d: %w (last ISR %v, err %v)", node, topic, partition, ctx.Err(), pd.ISR, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// close stops all nodes side by side and removes the cluster's files. The
// nodes are killed: a clean shutdown costs seconds and its only product, the
// data, is deleted next. With PLAYWATCH_KAFKA_KEEP=1 they shut down cleanly and
// the files stay for inspection.
func (k *apacheKafka) close(ctx context.Context) error {
	keep := os.Getenv("PLAYWATCH_KAFKA_KEEP") == "1"
	stop := k.KillNode
	if keep {
		stop = k.StopNode
	}
	if k.adminRaw != nil {
		k.adminRaw.Close()
	}
	k.mu.Lock()
	ids := make([]int32, 0, len(k.running))
	for id := range k.running {
		ids = append(ids, id)
	}
	k.mu.Unlock()
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { errs[i] = stop(ctx, id) })
	}
	wg.Wait()
	defer k.lock.Close()
	if keep {
		fmt.Fprintf(os.Stderr, "Apache Kafka files kept in %s until a later test run starts Kafka\n", k.dir)
	} else if err := os.RemoveAll(k.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", k.dir, err))
	}
	return errors.Join(errs...)
}
