#!/usr/bin/env bash
# End to end on docker-compose: a 6-client scenario (1 Byzantine) on digits, one container per
# client, built offline and run five times: Gaussian; sign-flip, regenerated with --set;
# ALIE, by editing the Byzantine service's one attack line; ALIE by two colluding Byzantine
# clients (4 honest), which pool what they receive over their own mutual-TLS calls; and two
# colluding twins against the screened rule, which they play whole. Each run must finish on every
# client and give, round for round, the weights and accuracies of the same scenario run in
# one process on the host. About 3 minutes on an idle 2-core machine (2.5 with the cache).
#
# The clients talk over mutual TLS with the certificates `dfedrw compose` makes (certs/), each
# service given only ca.pem and its own certificate and key as secrets, and run as a non-root
# user. Checked here: every client container ran as that user, its only writable mount was
# its own results folder and its secrets were its own three files; the Byzantine container,
# probed from inside, is not root, sees no other client's key or results, and what it writes
# under another client's name stays in its own folder; every final record and the summary say
# tls "mutual".
#
# Not part of `pytest`; `.ci/run` runs it unless DFEDRW_E2E_DOCKER=0. Needs root. Exit status:
# 0 passed, 77 skipped (no Docker engine can run here: the one line says why), else failed. It installs
# docker.io, docker-compose and debootstrap if missing, and starts its own Docker engine inside
# a network namespace it creates: that namespace has only loopback and the engine's own
# bridges, nothing is published, and the compose network is internal, so no container traffic
# leaves it. The engine has its own socket, data root and exec root under a temporary folder,
# apart from any other engine on the machine. Everything is torn down at exit.
#
# Settings (environment): PYTHON (default .venv/bin/python), DFEDRW_E2E_ROUNDS (50),
# DFEDRW_E2E_UP_TIMEOUT (seconds per `docker-compose up`, 600), DFEDRW_E2E_CACHE (base root
# file system and wheelhouse kept between runs, /var/tmp/dfedrw-e2e-cache; DFEDRW_E2E_FRESH=1
# rebuilds them), DFEDRW_E2E_KEEP=1 (keep the work folder for inspection).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO="$PWD"
PY="${PYTHON:-$REPO/.venv/bin/python}"
ROUNDS="${DFEDRW_E2E_ROUNDS:-50}"
UP_TIMEOUT="${DFEDRW_E2E_UP_TIMEOUT:-600}"
CACHE="${DFEDRW_E2E_CACHE:-/var/tmp/dfedrw-e2e-cache}"
BASE_IMAGE="dfedrw-base:bookworm"
IMAGE="dfedrw-e2e:latest"
CLIENTS=6

T0=$SECONDS
step() { echo "[docker-e2e +$((SECONDS - T0))s] $*" >&2; }
fail() { echo "[docker-e2e] FAILED: $*" >&2; exit 1; }
# Exit status 77: this machine cannot run a Docker engine here (not a failure of the project);
# .ci/run reports it as a skip with the reason.
cannot() { echo "[docker-e2e] SKIPPED: $*" >&2; exit 77; }

[ "$(id -u)" = 0 ] || cannot "needs root (network namespace, Docker engine)"
if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null || ! command -v debootstrap >/dev/null; then
    command -v apt-get >/dev/null || cannot "no dockerd, docker-compose or debootstrap, and no apt-get to install them"
    step "installing docker.io docker-compose debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose debootstrap >/dev/null
fi
[ -x "$PY" ] || bash scripts/setup.sh
# The client matching the engine installed with it (a newer client may stand first on PATH).
DOCKER="$(command -v /usr/bin/docker || command -v docker)"

WORK="$(mktemp -d /var/tmp/dfedrw-e2e.XXXXXX)"
NS="dfedrw-e2e-$$"
export DOCKER_HOST="unix://$WORK/docker.sock"
export COMPOSE_PROJECT_NAME="dfedrw-e2e"
# docker-compose v1 waits this long for a request to the engine (a build sends ~300 MB).
export COMPOSE_HTTP_TIMEOUT=300
CLUSTER="$WORK/cluster"
DOCKERD_PID=""

cleanup() {
    local rc=$?
    set +e
    if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
        if [ -f "$CLUSTER/docker-compose.yml" ]; then
            (cd "$CLUSTER" && timeout 120 docker-compose down --remove-orphans --timeout 5 >/dev/null 2>&1)
        fi
        kill -TERM "$DOCKERD_PID"
        for _ in $(seq 60); do
            kill -0 "$DOCKERD_PID" 2>/dev/null || break
            sleep 0.5
        done
        kill -0 "$DOCKERD_PID" 2>/dev/null && kill -KILL "$DOCKERD_PID"
        wait "$DOCKERD_PID" 2>/dev/null
    fi
    ip netns del "$NS" 2>/dev/null
    if [ "${DFEDRW_E2E_KEEP:-0}" = 1 ] || [ $rc != 0 ]; then
        echo "[docker-e2e] work folder kept: $WORK (engine log: $WORK/dockerd.log)" >&2
        # The engine's layers are of no use without it.
        rm -rf "$WORK/docker" "$WORK/exec"
    else
        rm -rf "$WORK"
    fi
    step "done (exit $rc)"
}
trap cleanup EXIT
# Exit (and so clean up) with the usual status on Ctrl-C or kill; bash acts on either once
# the command in the foreground has returned.
trap 'exit 130' INT
trap 'exit 143' TERM

# -- a Docker engine in a network namespace of its own ---------------------------------------
step "starting dockerd in network namespace $NS"
ip netns add "$NS" 2>/dev/null || cannot "cannot make a network namespace (ip netns add)"
ip netns exec "$NS" ip link set lo up
echo '{}' >"$WORK/daemon.json"
# --iptables=false: no rules anywhere (the namespace has no way out to masquerade to);
# --bridge=none: no default bridge; compose makes its own network, builds run with none.
# nsenter, not `ip netns exec`: the latter remounts /sys, which hides the cgroup mounts.
nsenter --net="/run/netns/$NS" dockerd \
    --host "$DOCKER_HOST" --config-file "$WORK/daemon.json" \
    --data-root "$WORK/docker" --exec-root "$WORK/exec" --pidfile "$WORK/dockerd.pid" \
    --storage-driver=overlay2 --iptables=false --ip-masq=false --bridge=none \
    >"$WORK/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for _ in $(seq 120); do
    "$DOCKER" version >/dev/null 2>&1 && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || cannot "the Docker engine does not start here: $(tail -3 "$WORK/dockerd.log" | tr '\n' ' ')"
    sleep 0.5
done
"$DOCKER" version >/dev/null 2>&1 || cannot "the Docker engine was not ready after 60 s: $(tail -3 "$WORK/dockerd.log" | tr '\n' ' ')"
[ -z "$(ip netns exec "$NS" ip route show default)" ] || fail "namespace $NS has a default route"

# -- the offline base image: minimal Debian with python3 ------------------------------------
mkdir -p "$CACHE"
if [ "${DFEDRW_E2E_FRESH:-0}" = 1 ]; then
    rm -rf "$CACHE/base-rootfs.tar" "$CACHE/wheelhouse"
fi
if [ ! -s "$CACHE/base-rootfs.tar" ]; then
    step "debootstrap bookworm (minbase + python3)"
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$WORK/rootfs" \
        http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1 \
        || fail "debootstrap: $(tail -5 "$WORK/debootstrap.log")"
    rm -f "$WORK"/rootfs/var/cache/apt/archives/*.deb
    tar -C "$WORK/rootfs" -cf "$CACHE/base-rootfs.tar.part" .
    mv "$CACHE/base-rootfs.tar.part" "$CACHE/base-rootfs.tar"
    rm -rf "$WORK/rootfs"
fi
step "docker import $BASE_IMAGE"
"$DOCKER" import "$CACHE/base-rootfs.tar" "$BASE_IMAGE" >/dev/null

# -- the cluster -------------------------------------------------------------------------------
# A long deadline: on a loaded machine a missed one would make the run differ from the
# in-process run it is compared with (rounds take milliseconds, so it costs nothing).
SETTINGS=(--set topology.honest=5 --set topology.byzantine=1 --set "rounds=$ROUNDS" --set eval.every=10
    --set network.round_timeout=30)
generate() {  # generate ATTACK [--set KEY=VALUE ...]
    "$PY" -m dfedrw.launch.cli compose --offline --image "$IMAGE" "${SETTINGS[@]}" --set "attack.name=$1" "${@:2}" --out "$CLUSTER" >&2
}
step "dfedrw compose ($CLIENTS clients, $ROUNDS rounds)"
generate gaussian
[ "$(cd "$CLUSTER" && docker-compose config --services | grep -c '^client-')" = "$CLIENTS" ] \
    || fail "expected $CLIENTS client services"
BYZ="$(grep -o '^  client-[0-9]*:  # Byzantine' "$CLUSTER/docker-compose.yml" | grep -o 'client-[0-9]*')"
BYZ_ID="${BYZ#client-}"
[ -n "$BYZ_ID" ] || fail "no Byzantine service in the compose file"
RUN_AS="$(grep -o '^    user: "[0-9]*:[0-9]*"' "$CLUSTER/docker-compose.yml" | sort -u | grep -o '[0-9][0-9]*:[0-9][0-9]*')"
[ "$(wc -l <<<"$RUN_AS")" = 1 ] && [ "${RUN_AS%%:*}" != 0 ] || fail "services should all run as one non-root user: $RUN_AS"
# File secrets are bind mounts: each key must be 0600 and owned by the containers' user.
for k in $(seq 0 $((CLIENTS - 1))); do
    [ "$(stat -c '%a %u:%g' "$CLUSTER/certs/client-$k.key")" = "600 $RUN_AS" ] \
        || fail "certs/client-$k.key: $(stat -c '%a %u:%g' "$CLUSTER/certs/client-$k.key"), expected 600 $RUN_AS"
done
step "services run as $RUN_AS; certificates of run $("$PY" -c 'import sys; from dfedrw.peer.transport.identity import run_id_of; print(run_id_of(sys.argv[1]))' "$CLUSTER/certs")"

step "wheelhouse"
PYTHON="$PY" bash scripts/build_wheelhouse.sh "$CACHE/wheelhouse" 2>&1 | grep -v "is ignored" >&2
cp -a "$CACHE/wheelhouse/." "$CLUSTER/wheelhouse/"

step "docker-compose build"
(cd "$CLUSTER" && docker-compose build) >"$WORK/build.log" 2>&1 || fail "build: $(tail -20 "$WORK/build.log")"

check_run() {  # check_run ATTACK LABEL: every client finished, ran the attack asked for, and matches the
    # same scenario run in one process on the host (same code, seeds and messages; compared only
    # when no client missed a deadline, since a missed one changes what was aggregated).
    # Colluders (attack.colluding) must also have pooled with each other.
    "$PY" -m dfedrw.launch.cli run "$CLUSTER/scenario.toml" --set network.transport=inproc --set network.host=127.0.0.1 \
        --set "attack.name=$1" --out "$WORK/inproc-$2" >"$WORK/inproc-$2.log" 2>&1 || fail "in-process run ($2): $(tail -5 "$WORK/inproc-$2.log")"
    "$PY" - "$CLUSTER/results" "$WORK/inproc-$2" "$CLIENTS" "$1" <<'EOF'
import json, sys
from pathlib import Path
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_rounds
results, inproc, clients, attack = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
finals = {k: json.loads((results / "peers" / f"{k}.json").read_text()) for k in range(clients)}
bad = [k for k, f in finals.items() if not f.get("completed")]
assert not bad, f"clients not completed: {bad}"
summary = json.loads((results / "summary.json").read_text())
byzantine = sorted(int(k) for k, p in summary["peers"].items() if p["role"] == "byzantine")
assert byzantine, "no Byzantine client in the summary"
for byz in byzantine:
    assert finals[byz]["attack"] == attack, f"client {byz} ran {finals[byz]['attack']!r}, not {attack!r}"
not_tls = {k: f.get("tls") for k, f in finals.items() if f.get("tls") != "mutual"}
assert not not_tls, f"clients not on mutual TLS: {not_tls}"
assert summary["tls"] == "mutual", summary["tls"]
assert summary["failed_peers"] == [], summary["failed_peers"]
assert summary["honest_completed"] == clients - len(byzantine), summary["honest_completed"]
if load_scenario(inproc / "scenario.toml").attack.colluding:
    pooled = {b: sum(1 for r in read_rounds(results, b) if r.get("pooled_from") == byzantine) for b in byzantine}
    assert all(pooled.values()), f"colluders that never pooled with all of {byzantine}: {pooled}"
    print(f"{attack}: colluders {byzantine} pooled with each other in {min(pooled.values())}+ of their rounds", file=sys.stderr)
missed = sum(1 for k in range(clients) if k not in byzantine for r in read_rounds(results, k) if r["missing"])
for k in range(clients):
    if k in byzantine or missed:
        continue
    rounds, local = read_rounds(results, k), read_rounds(inproc, k)
    assert [r["weights"] for r in rounds] == [r["weights"] for r in local], f"client {k}: weights differ from the in-process run"
    theirs = json.loads((inproc / "peers" / f"{k}.json").read_text())["accuracy"]
    assert finals[k]["accuracy"] == theirs, f"client {k}: accuracy {finals[k]['accuracy']} vs {theirs} in process"
print(f"{attack}: honest mean accuracy {summary['honest_mean_accuracy']:.2f}%, "
      f"Byzantine weight share {summary['byzantine_weight_share']:.4f}, round loop {summary['wall_seconds']:.1f} s; "
      + (f"not compared with the in-process run: {missed} missed deadlines" if missed
         else "per-round weights and accuracies equal to the in-process run")
      + f"; tls {summary['tls']} on all {clients} clients", file=sys.stderr)
EOF
}

check_containers() {  # check_containers ATTACK: how each client container was set up, from the engine
    (cd "$CLUSTER" && docker-compose ps -q) | xargs "$DOCKER" inspect >"$WORK/inspect-$1.json"
    "$PY" - "$WORK/inspect-$1.json" "$CLUSTER" "$RUN_AS" "$CLIENTS" <<'EOF'
import json, sys
from pathlib import Path
containers, cluster, run_as, clients = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]).resolve(), sys.argv[3], int(sys.argv[4])
seen = set()
for c in containers:
    service = c["Config"]["Labels"]["com.docker.compose.service"]
    if not service.startswith("client-"):
        continue
    k = int(service.split("-")[1])
    seen.add(k)
    assert c["Config"]["User"] == run_as, f"{service} ran as {c['Config']['User']!r}, not {run_as}"
    writable = [(m["Source"], m["Destination"]) for m in c["Mounts"] if m["RW"]]
    assert writable == [(str(cluster / "results" / "clients" / str(k)), "/results/peers")], f"{service} writable mounts: {writable}"
    secrets = sorted(m["Destination"] for m in c["Mounts"] if m["Destination"].startswith("/run/secrets/"))
    assert secrets == sorted(f"/run/secrets/{f}" for f in ("ca.pem", f"client-{k}.pem", f"client-{k}.key")), f"{service} secrets: {secrets}"
assert seen == set(range(clients)), f"client containers: {sorted(seen)}"
print(f"{len(seen)} client containers: user {run_as}, one writable mount each (its own results/clients/K), "
      "secrets ca.pem + its own certificate and key", file=sys.stderr)
EOF
}

probe_byzantine() {  # from inside the Byzantine service's container, after a run
    local other=0
    [ "$BYZ_ID" != 0 ] || other=1
    local before
    before="$(sha256sum <"$CLUSTER/results/peers/$other.json")"
    (cd "$CLUSTER" && timeout 120 docker-compose run --rm --no-deps --entrypoint sh "$BYZ" -c '
        echo "uid=$(id -u) gid=$(id -g)"
        echo "secrets: $(ls -A /run/secrets | sort | tr "\n" " ")"
        echo "results: $(ls -A /results/peers | sort | tr "\n" " ")"
        for path in /results/clients /results/summary.json /results/x /run/secrets/x /scenario/x /run/secrets/client-'"$other"'.key; do
            if (: >"$path") 2>/dev/null || mkdir "$path" 2>/dev/null; then echo "WROTE $path"; fi
        done
        for k in $(seq 0 '"$((CLIENTS - 1))"'); do
            [ "$k" = '"$BYZ_ID"' ] || { [ ! -e "/run/secrets/client-$k.key" ] && [ ! -e "/results/clients/$k" ]; } || echo "SEES client $k"
        done
        echo forged >/results/peers/'"$other"'.json && echo "wrote /results/peers/'"$other"'.json"
    ') >"$WORK/probe.log" 2>&1 || fail "probe of $BYZ: $(cat "$WORK/probe.log")"
    sed 's/^/[docker-e2e]   /' "$WORK/probe.log" >&2
    grep -q "^uid=0 " "$WORK/probe.log" && fail "$BYZ runs as root"
    grep -q "^uid=${RUN_AS%%:*} gid=${RUN_AS##*:}$" "$WORK/probe.log" || fail "$BYZ does not run as $RUN_AS"
    grep -q "^secrets: ca.pem $BYZ.key $BYZ.pem $" "$WORK/probe.log" || fail "$BYZ has other secrets than its own"
    grep -q "^results: $BYZ_ID.json $BYZ_ID.jsonl $" "$WORK/probe.log" || fail "$BYZ sees other results than its own"
    grep -q "^WROTE \|^SEES " "$WORK/probe.log" && fail "$BYZ could write or see what it should not"
    # Its forged record landed in its own folder; client $other's record is unchanged.
    [ "$(cat "$CLUSTER/results/clients/$BYZ_ID/$other.json")" = forged ] || fail "the forged file is not in $BYZ's own folder"
    [ "$(sha256sum <"$CLUSTER/results/peers/$other.json")" = "$before" ] || fail "client $other's record changed"
    rm "$CLUSTER/results/clients/$BYZ_ID/$other.json"
    step "$BYZ: not root, only its own secrets and results; its write as client $other stayed in its own folder"
}

run_cluster() {  # run_cluster ATTACK [LABEL]: LABEL (default ATTACK) names the run's logs
    local label="${2:-$1}"
    step "docker-compose up ($label)"
    local t=$SECONDS
    (cd "$CLUSTER" && timeout "$UP_TIMEOUT" docker-compose up --no-color) >"$WORK/up-$label.log" 2>&1 \
        || fail "docker-compose up ($label): $(tail -20 "$WORK/up-$label.log")"
    step "up ($label) took $((SECONDS - t)) s; docker-compose logs holds" \
        "$(cd "$CLUSTER" && docker-compose logs --no-color | grep -c " round [0-9]*/$ROUNDS") progress lines"
    local codes
    codes="$(cd "$CLUSTER" && docker-compose ps -q | xargs "$DOCKER" inspect -f '{{.Name}} {{.State.ExitCode}}')"
    if grep -v ' 0$' <<<"$codes" >&2; then
        fail "a client exited non-zero ($label); see $WORK/up-$label.log"
    fi
    check_containers "$label" || fail "containers ($label); see $WORK/inspect-$label.json"
    (cd "$CLUSTER" && timeout 300 docker-compose run --rm summarize) >"$WORK/summarize-$label.log" 2>&1 \
        || fail "summarize ($label): $(tail -20 "$WORK/summarize-$label.log")"
    check_run "$1" "$label" || fail "results ($label); see $WORK/up-$label.log"
    if [ "$1" = gaussian ]; then
        probe_byzantine
    fi
    (cd "$CLUSTER" && timeout 120 docker-compose down --timeout 5) >>"$WORK/up-$label.log" 2>&1 || fail "docker-compose down ($label)"
}

run_cluster gaussian
mv "$CLUSTER/results" "$WORK/results-gaussian"

step "swap the attack: regenerate with --set attack.name=sign_flip"
cp "$CLUSTER/docker-compose.yml" "$WORK/compose-gaussian.yml"
generate sign_flip
changed="$(diff "$WORK/compose-gaussian.yml" "$CLUSTER/docker-compose.yml" | grep -c '^[<>]' || true)"
[ "$changed" = 2 ] || fail "swapping the attack changed $changed lines of the compose file, expected 1 each way"
grep -q 'DFEDRW_ATTACK: "sign_flip"' "$CLUSTER/docker-compose.yml" || fail "no sign_flip line"
run_cluster sign_flip
mv "$CLUSTER/results" "$WORK/results-sign_flip"

step "swap the attack: edit the one line of the Byzantine service to alie"
# A fresh results/ (per-client folders and links) from the same command; certs/ is kept.
certs_before="$(cat "$CLUSTER"/certs/*.pem | sha256sum)"
generate sign_flip
[ "$(cat "$CLUSTER"/certs/*.pem | sha256sum)" = "$certs_before" ] || fail "writing the folder again replaced certs/"
sed -i 's/DFEDRW_ATTACK: "sign_flip"/DFEDRW_ATTACK: "alie"/' "$CLUSTER/docker-compose.yml"
run_cluster alie

mv "$CLUSTER/results" "$WORK/results-alie"

step "a colluding attack: two Byzantine clients pool what they receive and agree one plan (--set attack.colluding=true)"
generate alie --set topology.honest=4 --set topology.byzantine=2 --set attack.colluding=true
[ "$(grep -c '^  client-[0-9]*:  # Byzantine' "$CLUSTER/docker-compose.yml")" = 2 ] || fail "expected 2 Byzantine services"
run_cluster alie alie-colluding
mv "$CLUSTER/results" "$WORK/results-alie-colluding"

step "a defence played whole by colluders: the colluding twins against the screened rule (Krum's screen, then the loss)"
generate colluding_twins --set topology.honest=4 --set topology.byzantine=2 --set attack.colluding=true \
    --set aggregation.rule=screened_reweighting --set aggregation.tpm=loss --set aggregation.crs=loss_drop_highest
grep -q 'rule = "screened_reweighting"' "$CLUSTER/scenario.toml" || fail "the compose folder's scenario lacks the screened rule"
run_cluster colluding_twins twins-screened

step "passed in $((SECONDS - T0)) s"
