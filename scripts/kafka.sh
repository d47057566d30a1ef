#!/usr/bin/env bash
# Runs a throwaway Apache Kafka (KRaft, combined broker+controller nodes) on
# loopback for playwatch's integration tests. Nothing here is for production.
#
#   scripts/kafka.sh fetch
#       Resolve the Kafka jars into $PLAYWATCH_KAFKA_LIBS (default .cache/kafka/libs)
#       with Maven unless they are there for the current pom, then record a
#       class-data-sharing archive of a started node there, which halves later
#       JVM starts. Idempotent.
#   scripts/kafka.sh start DIR NODES BASEPORT
#       Configure, format and start NODES (1 or 3) nodes under DIR in the background
#       and wait until each one serves. Node i listens for clients on BASEPORT+2(i-1)
#       and for the controller quorum on BASEPORT+2(i-1)+1.
#   scripts/kafka.sh stop DIR
#       Stop every node started under DIR: SIGTERM, wait, then SIGKILL.
#   scripts/kafka.sh status DIR
#   scripts/kafka.sh check
#       Say whether the Go tests can run Apache Kafka here, and if not why;
#       exits 1 when they cannot.
#
# Building blocks, also used by the Go test helper (kafka_apache_test.go), which
# starts the JVMs itself so that they die with the test binary:
#   scripts/kafka.sh configure DIR CLIENT_PORTS CONTROLLER_PORTS [SASL_SSL_PORTS MTLS_PORTS]
#       Comma-separated port lists, one entry per node. Writes DIR/node-ID/server.properties
#       and formats each node's storage with a fixed cluster id. With the two optional
#       lists each node also listens with SASL_SSL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)
#       and with SSL that requires a client certificate (mTLS), using the PEM files of
#       $PLAYWATCH_KAFKA_TLS_DIR: keystore.pem (private key, then the certificate chain)
#       and ca.pem (the CA of client certificates). $PLAYWATCH_KAFKA_SASL_USERS lists
#       the users, "name:password" separated by spaces (letters and digits only): each
#       gets PLAIN and both SCRAM credentials, the latter added when the storage is formatted.
#   scripts/kafka.sh run-node DIR ID
#       exec the JVM of one configured node in the foreground (same pid).
#   scripts/kafka.sh wait-node DIR ID [TIMEOUT_SECONDS]
#   scripts/kafka.sh start-node DIR ID / stop-node DIR ID / kill-node DIR ID
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
libs_dir=${PLAYWATCH_KAFKA_LIBS:-$repo_root/.cache/kafka/libs}
pom=$repo_root/testdata/kafka/pom.xml
# A dynamic class-data-sharing archive: the classes a started node loaded, kept
# pre-parsed. The JVM checks it against the class path and the JDK and, with
# -Xshare:auto, silently ignores it when it does not match.
cds_archive=$libs_dir/kafka-server.jsa

# A fixed cluster id keeps formatting deterministic: base64url("playwatch-test-1").
cluster_id=cGxheXdhdGNoLXRlc3QtMQ

# The heap stays small because CI and developers share a 2-core machine; the
# other flags trade peak throughput for a faster JVM start.
kafka_java_opts=(
	-Xms64m -Xmx256m -XX:MaxDirectMemorySize=128m
	-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto -Xss512k
	-XX:-UsePerfData -Djava.awt.headless=true
)

die() {
	echo "kafka.sh: $*" >&2
	exit 1
}

have_jars() {
	compgen -G "$libs_dir/kafka_2.13-*.jar" >/dev/null
}

cmd_fetch() {
	local want
	# Serialise fetches that share a libs directory (e.g. a cache under $HOME).
	mkdir -p "$(dirname "$libs_dir")"
	exec 9>"$libs_dir.lock"
	flock 9
	want=$(sha256sum "$pom" | cut -d' ' -f1)
	if [[ $(cat "$libs_dir/.complete" 2>/dev/null) != "$want" ]]; then
		command -v mvn >/dev/null || die "mvn not found; install Maven (apt-get install maven)"
		# Copy into a temporary directory first so that an interrupted download
		# never leaves a half-filled libs directory that looks usable.
		local tmp=$libs_dir.tmp.$$
		rm -rf "$tmp"
		# Maven's output matters only when it fails.
		if ! mvn -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$tmp" >"$tmp.log" 2>&1; then
			cat "$tmp.log" >&2
			die "mvn could not resolve the Kafka jars (log above)"
		fi
		rm -f "$tmp.log"
		echo "$want" >"$tmp/.complete"
		rm -rf "$libs_dir"
		mv "$tmp" "$libs_dir"
		echo "kafka.sh: jars in $libs_dir ($(du -sh "$libs_dir" | cut -f1))"
	fi
	if [[ ! -f $cds_archive ]]; then
		make_cds_archive || echo "kafka.sh: no class-data archive; nodes will start slower" >&2
	fi
}

# free_port prints a loopback port that nothing listens on right now.
free_port() {
	local p
	while :; do
		p=$((30000 + RANDOM % 30000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
}

# make_cds_archive starts one throwaway node with -XX:ArchiveClassesAtExit and
# stops it; the JVM writes the archive as it exits.
make_cds_archive() {
	require_runtime
	local tmp dump=$cds_archive.tmp.$$ ok=0
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/playwatch-kafkacds.XXXXXX")
	(cmd_configure "$tmp" "$(free_port)" "$(free_port)") &&
		PLAYWATCH_KAFKA_CDS_DUMP=$dump cmd_start_node "$tmp" 1 &&
		(cmd_wait_node "$tmp" 1 120) && ok=1
	cmd_stop_node "$tmp" 1 60
	rm -rf "$tmp"
	if [[ $ok -eq 1 && -s $dump ]]; then
		mv "$dump" "$cds_archive"
		echo "kafka.sh: class-data archive $cds_archive ($(du -sh "$cds_archive" | cut -f1))"
		return 0
	fi
	rm -f "$dump"
	return 1
}

# set_cds_flags fills cds_flags with the JVM flag that uses (or, while fetch
# records it, writes) the class-data archive.
set_cds_flags() {
	cds_flags=()
	if [[ -n ${PLAYWATCH_KAFKA_CDS_DUMP:-} ]]; then
		cds_flags=(-XX:ArchiveClassesAtExit="$PLAYWATCH_KAFKA_CDS_DUMP")
	elif [[ -f $cds_archive ]]; then
		cds_flags=(-XX:SharedArchiveFile="$cds_archive")
	fi
}

require_runtime() {
	command -v java >/dev/null || die "java not found (Java 17+ is needed)"
	have_jars || die "no Kafka jars in $libs_dir; run 'make kafka-jars' or 'scripts/kafka.sh fetch'"
}

cmd_check() {
	local java_version jar
	if ! command -v java >/dev/null; then
		echo "Apache Kafka tests: will skip: java is not on PATH (Java 17+ is needed)"
		return 1
	fi
	if ! have_jars; then
		echo "Apache Kafka tests: will skip: no Kafka jars in $libs_dir; run 'make kafka-jars' or 'scripts/kafka.sh fetch'"
		return 1
	fi
	java_version=$(java -version 2>&1 | head -1)
	jar=$(basename "$(compgen -G "$libs_dir/kafka_2.13-*.jar" | head -1)")
	local cds="no class-data archive, slower starts"
	[[ -f $cds_archive ]] && cds="class-data archive"
	echo "Apache Kafka tests: will run ($jar, $java_version, $cds)"
}

node_dir() { echo "$1/node-$2"; }

node_count() {
	local n
	n=$(cat "$1/nodes" 2>/dev/null) || die "$1 is not a configured Kafka directory"
	echo "$n"
}

# secured_properties SASL_SSL_PORT MTLS_PORT CLIENT_PORT CONTROLLER_PORT prints
# the lines that add the secured listeners to a node's server.properties; the
# later of two equal keys wins.
secured_properties() {
	local sasl_port=$1 mtls_port=$2 client_port=$3 controller_port=$4
	local tls_dir=${PLAYWATCH_KAFKA_TLS_DIR:?PLAYWATCH_KAFKA_TLS_DIR is not set}
	local user plain_users=""
	for user in ${PLAYWATCH_KAFKA_SASL_USERS:-}; do
		plain_users+=" user_${user%%:*}=\"${user#*:}\""
	done
	cat <<EOF
listeners=PLAINTEXT://127.0.0.1:$client_port,CONTROLLER://127.0.0.1:$controller_port,SASL_SSL://127.0.0.1:$sasl_port,SSL://127.0.0.1:$mtls_port
advertised.listeners=PLAINTEXT://127.0.0.1:$client_port,SASL_SSL://127.0.0.1:$sasl_port,SSL://127.0.0.1:$mtls_port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL
ssl.keystore.type=PEM
ssl.keystore.location=$tls_dir/keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$tls_dir/ca.pem
ssl.client.auth=none
listener.name.ssl.ssl.client.auth=required
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required$plain_users;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
EOF
}

# configure DIR CLIENT_PORTS CONTROLLER_PORTS [SASL_SSL_PORTS MTLS_PORTS]
cmd_configure() {
	local dir=$1 client_csv=$2 controller_csv=$3 sasl_csv=${4:-} mtls_csv=${5:-}
	require_runtime
	local -a client_ports controller_ports sasl_ports=() mtls_ports=() scram_args=()
	IFS=, read -r -a client_ports <<<"$client_csv"
	IFS=, read -r -a controller_ports <<<"$controller_csv"
	if [[ -n $sasl_csv ]]; then
		IFS=, read -r -a sasl_ports <<<"$sasl_csv"
		IFS=, read -r -a mtls_ports <<<"$mtls_csv"
		[[ ${#sasl_ports[@]} -eq ${#client_ports[@]} && ${#mtls_ports[@]} -eq ${#client_ports[@]} ]] ||
			die "need as many SASL_SSL and mTLS ports as client ports"
		local user
		for user in ${PLAYWATCH_KAFKA_SASL_USERS:-}; do
			[[ $user =~ ^[A-Za-z0-9]+:[A-Za-z0-9]+$ ]] || die "PLAYWATCH_KAFKA_SASL_USERS: \"$user\" is not name:password of letters and digits"
			scram_args+=(--add-scram "SCRAM-SHA-256=[name=${user%%:*},password=${user#*:}]"
				--add-scram "SCRAM-SHA-512=[name=${user%%:*},password=${user#*:}]")
		done
	fi
	local nodes=${#client_ports[@]}
	[[ $nodes -eq ${#controller_ports[@]} ]] || die "need as many controller ports as client ports"
	[[ $nodes -eq 1 || $nodes -eq 3 ]] || die "NODES must be 1 or 3, got $nodes"

	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	echo "$nodes" >"$dir/nodes"

	local voters="" i
	for ((i = 1; i <= nodes; i++)); do
		voters+="${voters:+,}$i@127.0.0.1:${controller_ports[i - 1]}"
	done

	# Replication of the internal topics must fit the node count; with three nodes
	# the cluster keeps accepting acks=all writes while one node is down.
	# The session and quorum timeouts below are shorter than Kafka's defaults so
	# that a killed node is noticed in seconds, yet long enough that a node
	# starved of CPU on a busy shared machine is not fenced by mistake.
	local rf=1 min_isr=1
	if [[ $nodes -eq 3 ]]; then
		rf=3 min_isr=2
	fi

	for ((i = 1; i <= nodes; i++)); do
		local nd
		nd=$(node_dir "$dir" "$i")
		mkdir -p "$nd"
		cat >"$nd/server.properties" <<EOF
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:${client_ports[i - 1]},CONTROLLER://127.0.0.1:${controller_ports[i - 1]}
advertised.listeners=PLAINTEXT://127.0.0.1:${client_ports[i - 1]}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$nd/data
metadata.log.dir=$nd/metadata
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$min_isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$min_isr
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$min_isr
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=2
log.segment.bytes=4194304
log.retention.check.interval.ms=60000
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=2097152
controller.quorum.election.timeout.ms=1000
controller.quorum.fetch.timeout.ms=3000
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=6000
replica.lag.time.max.ms=10000
EOF
		if [[ -n $sasl_csv ]]; then
			secured_properties "${sasl_ports[i - 1]}" "${mtls_ports[i - 1]}" "${client_ports[i - 1]}" "${controller_ports[i - 1]}" >>"$nd/server.properties"
		fi
		cat >"$nd/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $nd/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = WARN
EOF
	done

	# Formatting starts one short JVM per node; run them side by side.
	local -a pids=() cds_flags
	set_cds_flags
	for ((i = 1; i <= nodes; i++)); do
		nd=$(node_dir "$dir" "$i")
		java "${kafka_java_opts[@]}" "${cds_flags[@]}" -Dlog4j2.configurationFile="$nd/log4j2.properties" \
			-cp "$libs_dir/*" kafka.tools.StorageTool format --ignore-formatted \
			--cluster-id "$cluster_id" --config "$nd/server.properties" "${scram_args[@]}" \
			>"$nd/format.log" 2>&1 &
		pids+=($!)
	done
	for ((i = 1; i <= nodes; i++)); do
		wait "${pids[i - 1]}" || die "formatting node $i failed: $(cat "$(node_dir "$dir" "$i")/format.log")"
	done
}

# run-node DIR ID: replaces this shell with the node's JVM.
cmd_run_node() {
	local nd
	nd=$(node_dir "$1" "$2")
	[[ -f $nd/server.properties ]] || die "node $2 is not configured under $1"
	require_runtime
	local -a cds_flags
	set_cds_flags
	exec java "${kafka_java_opts[@]}" "${cds_flags[@]}" -server \
		-Dlog4j2.configurationFile="$nd/log4j2.properties" \
		-Dkafka.logs.dir="$nd" \
		-cp "$libs_dir/*" kafka.Kafka "$nd/server.properties"
}

node_port() {
	sed -n 's#^advertised.listeners=PLAINTEXT://127.0.0.1:\([0-9]*\)$#\1#p' "$(node_dir "$1" "$2")/server.properties"
}

# wait-node DIR ID [TIMEOUT]: the node logs that it started, and its client port accepts.
cmd_wait_node() {
	local dir=$1 id=$2 timeout=${3:-120}
	local nd port deadline=$((SECONDS + timeout))
	nd=$(node_dir "$dir" "$id")
	port=$(node_port "$dir" "$id")
	while ((SECONDS < deadline)); do
		if ! node_pid "$dir" "$id" >/dev/null; then
			die "node $id exited while starting; see $nd/server.log and $nd/stdout.log"
		fi
		if grep -q 'Kafka Server started' "$nd/server.log" 2>/dev/null &&
			(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			return 0
		fi
		sleep 0.2
	done
	die "node $id not ready after ${timeout}s; see $nd/server.log"
}

cmd_start_node() {
	local dir=$1 id=$2 nd pid
	nd=$(node_dir "$dir" "$id")
	if pid=$(node_pid "$dir" "$id"); then
		die "node $id already runs as pid $pid"
	fi
	# A fresh log makes wait-node look at this start only.
	[[ -f $nd/server.log ]] && mv "$nd/server.log" "$nd/server.log.$(date +%s%N)"
	# setsid: own process group, so that stop can signal the node without
	# touching the caller's group.
	setsid bash "$repo_root/scripts/kafka.sh" run-node "$dir" "$id" >"$nd/stdout.log" 2>&1 </dev/null &
	echo $! >"$nd/pid"
}

# node_pid DIR ID prints the pid of node ID if that process still runs. The
# pid file alone is not enough: its number may since belong to a process that
# is not ours, so the command line must name DIR.
node_pid() {
	local pid
	pid=$(cat "$(node_dir "$1" "$2")/pid" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$1" || return 1
	echo "$pid"
}

# stop_node DIR ID GRACE SIGNAL: send SIGNAL, then SIGKILL after GRACE seconds.
stop_node() {
	local dir=$1 id=$2 grace=$3 sig=$4 pid i
	if pid=$(node_pid "$dir" "$id"); then
		kill "-$sig" "$pid" 2>/dev/null || true
		for ((i = 0; i < grace * 5; i++)); do
			node_pid "$dir" "$id" >/dev/null || break
			sleep 0.2
		done
		if pid=$(node_pid "$dir" "$id"); then
			echo "kafka.sh: node $id ignored SIG$sig for ${grace}s; sending SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
			while node_pid "$dir" "$id" >/dev/null; do sleep 0.1; done
		fi
	fi
	rm -f "$(node_dir "$dir" "$id")/pid"
}

cmd_stop_node() { stop_node "$1" "$2" "${3:-30}" TERM; }

cmd_kill_node() { stop_node "$1" "$2" 5 KILL; }

cmd_start() {
	local dir=$1 nodes=$2 base=$3 i
	local client="" controller=""
	for ((i = 0; i < nodes; i++)); do
		client+="${client:+,}$((base + 2 * i))"
		controller+="${controller:+,}$((base + 2 * i + 1))"
	done
	local t0=$SECONDS
	cmd_configure "$dir" "$client" "$controller"
	dir=$(cd "$dir" && pwd)
	for ((i = 1; i <= nodes; i++)); do
		cmd_start_node "$dir" "$i"
	done
	for ((i = 1; i <= nodes; i++)); do
		# A subshell: cmd_wait_node dies on failure, which would skip the stop.
		(cmd_wait_node "$dir" "$i") || {
			cmd_stop "$dir"
			exit 1
		}
	done
	echo "kafka.sh: $nodes node(s) ready in $((SECONDS - t0))s; bootstrap servers $client"
}

cmd_stop() {
	local dir=$1 nodes i
	nodes=$(node_count "$dir")
	# Stop the nodes side by side; a lone survivor of a 3-node quorum waits in
	# controlled shutdown, so the grace period bounds it.
	for ((i = 1; i <= nodes; i++)); do
		cmd_stop_node "$dir" "$i" 20 &
	done
	wait
}

cmd_status() {
	local dir=$1 nodes i pid
	nodes=$(node_count "$dir")
	for ((i = 1; i <= nodes; i++)); do
		if pid=$(node_pid "$dir" "$i"); then
			echo "node $i: running, pid $pid, port $(node_port "$dir" "$i")"
		else
			echo "node $i: stopped"
		fi
	done
}

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 2
}

[[ $# -ge 1 ]] || usage
sub=$1
shift
# Node commands compare DIR with process command lines: make it absolute.
case $sub in
run-node | wait-node | stop | status | start-node | stop-node | kill-node)
	[[ $# -ge 1 && -d $1 ]] || die "no such directory: ${1:-}"
	set -- "$(cd "$1" && pwd)" "${@:2}"
	;;
esac
case $sub in
fetch) cmd_fetch ;;
check) cmd_check ;;
configure) [[ $# -eq 3 || $# -eq 5 ]] || usage && cmd_configure "$@" ;;
run-node) [[ $# -eq 2 ]] || usage && cmd_run_node "$@" ;;
wait-node) [[ $# -ge 2 ]] || usage && cmd_wait_node "$@" ;;
start) [[ $# -eq 3 ]] || usage && cmd_start "$@" ;;
stop) [[ $# -eq 1 ]] || usage && cmd_stop "$@" ;;
status) [[ $# -eq 1 ]] || usage && cmd_status "$@" ;;
start-node) [[ $# -eq 2 ]] || usage && cmd_start_node "$@" ;;
stop-node) [[ $# -eq 2 ]] || usage && cmd_stop_node "$@" ;;
kill-node) [[ $# -eq 2 ]] || usage && cmd_kill_node "$@" ;;
*) usage ;;
esac
