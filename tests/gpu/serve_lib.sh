# Helpers of the GPU scripts that run `pyqsa serve` across device calls (mission.sh, agents.sh),
# sourced by them. The caller sets: state (the state folder), py (python), t_end (unix time this
# call must return by) and rerun (the command that continues the work, for `pending`).
# A server and a job outlive the call that started them (setsid); their pids, logs, flags and
# results are files under $state, so the next call finds them.

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2> /dev/null; }
left() { echo $(( t_end - $(date +%s) )); }
pending() { echo "$rerun: still running; run \`$rerun\` again"; exit 75; }

stop_server() {  # which
    local pid
    if alive "$state/$1.pid"; then
        pid=$(cat "$state/$1.pid")
        kill "$pid"
        for _ in $(seq 60); do kill -0 "$pid" 2> /dev/null || break; sleep 1; done
        kill -0 "$pid" 2> /dev/null && kill -9 "$pid"
        echo "stopped the $1 server (pid $pid)"
    fi
    rm -f "$state/$1.pid"
}

url_of() {  # which: the URL its server said it serves at (none before it listens)
    sed -n 's|^pyqsa: serving .* at \(http://[^ ]*\)/v1$|\1|p' "$state/$1.log" 2> /dev/null | head -n 1
}

# starts a server (unless it runs) and nvidia-smi's sampler of it, without waiting for it
launch_server() {  # which, serve flags...
    local which=$1
    shift
    if ! alive "$state/$which.pid"; then
        rm -f "$state/$which-baseline.json" "$state/$which-smi.csv" "$state/$which-load.json"
        echo "pyqsa serve $*" > "$state/$which.flags"
        # TRACE_OUT set: the server's engine steps timestamped (bench/ttft_trace.py), written there at exit
        local entry=(-m pyqsa.cli)
        [ -z "${TRACE_OUT:-}" ] || entry=(bench/ttft_trace.py)
        setsid "$py" "${entry[@]}" serve "$@" --port 0 > "$state/$which.log" 2>&1 < /dev/null &
        echo $! > "$state/$which.pid"
        if command -v nvidia-smi > /dev/null; then
            setsid "$py" bench/mission.py smi --pid "$(cat "$state/$which.pid")" --out "$state/$which-smi.csv" \
                > "$state/$which-smi.log" 2>&1 < /dev/null &
        fi
        echo "started the $which server (pid $(cat "$state/$which.pid")): $(cat "$state/$which.flags")"
    fi
}

# launch_server, then waits until it listens and its baseline (bench/mission.py baseline:
# ledger, nvidia-smi) is taken; another call's start_server of the same name only waits
start_server() {  # which, serve flags...
    local which=$1 url
    if [ -f "$state/$which-baseline.json" ] && alive "$state/$which.pid"; then
        echo "the $which server runs (pid $(cat "$state/$which.pid")), baseline taken"; return 0
    fi
    launch_server "$@"
    until url=$(url_of "$which") && [ -n "$url" ] && curl -sf "$url/health" > /dev/null; do
        alive "$state/$which.pid" || { echo "the $which server exited:"; tail -n 30 "$state/$which.log"; exit 1; }
        [ "$(left)" -gt 0 ] || pending
        sleep 2
    done
    grep -E "^pyqsa: " "$state/$which.log"
    "$py" bench/mission.py baseline "$url" --smi "$state/$which-smi.csv" --log "$state/$which.log" \
        --out "$state/$which-baseline.json" || exit 1
}

# a background job that outlives this call: started once, then waited for until its result file
# exists (or this call's time is up)
job() {  # name, result file, command...
    local name=$1 result=$2
    shift 2
    if [ ! -f "$result" ] && ! alive "$state/$name.pid"; then
        setsid "$@" > "$state/$name.log" 2>&1 < /dev/null &
        echo $! > "$state/$name.pid"
        echo "started $name (pid $(cat "$state/$name.pid")): $*"
    fi
    while [ ! -f "$result" ]; do
        if ! alive "$state/$name.pid"; then
            [ -f "$result" ] && break
            echo "$name ended without a result:"; tail -n 30 "$state/$name.log"; exit 1
        fi
        [ "$(left)" -gt 0 ] || { tail -n 3 "$state/$name.log"; pending; }
        sleep 5
    done
    tail -n 3 "$state/$name.log"
}
