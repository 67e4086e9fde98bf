#!/bin/bash
# Instructions the server executes per echo step, counted by callgrind (valgrind):
# unlike steps per CPU-second, the count barely moves with the machine's speed.
#
#   benchmarks/callgrind_steps.sh NAME PYTHONPATH PORT
#
# NAME labels the run; PYTHONPATH puts another revision's src first (from
# `benchmarks/run.py --baseline REV`: benchmarks/.baseline-REV/src), or "" for
# this checkout; SERVER (env) replaces the default command, `openenv serve
# envs/echo_env`. The server runs under callgrind on core 0; `openenv bench`
# (64 sessions) warms it for 10 s, the counters are zeroed, 30 s are measured.
set -e
cd "$(dirname "$0")/.."
NAME=$1; PP=$2; PORT=$3
rm -f /tmp/cg_$NAME.* /tmp/cgw_$NAME.json /tmp/cgm_$NAME.json
PYTHONPATH="$PP" taskset -c 0 valgrind --tool=callgrind --callgrind-out-file=/tmp/cg_$NAME.out \
  .venv/bin/python ${SERVER:-.venv/bin/openenv serve envs/echo_env --max-sessions 2000} --port $PORT > /tmp/cg_$NAME.log 2>&1 &
for i in $(seq 600); do curl -s -m 2 localhost:$PORT/health >/dev/null && break; sleep 1; done
echo "up after $i s"
# warm-up
taskset -c 1 .venv/bin/openenv bench http://127.0.0.1:$PORT --sessions 64 --action '{"message": "hello"}' --duration 10 --json --client picows > /tmp/cgw_$NAME.json 2>/dev/null
PID=$(pgrep -f "valgrind.*port $PORT" | head -1)
callgrind_control -z $PID > /dev/null
taskset -c 1 .venv/bin/openenv bench http://127.0.0.1:$PORT --sessions 64 --action '{"message": "hello"}' --duration 30 --json --client picows > /tmp/cgm_$NAME.json 2>/dev/null
callgrind_control -d $PID > /dev/null
sleep 2
kill $PID; sleep 3
python3 - <<PY
import json,glob,re
rep=json.load(open('/tmp/cgm_$NAME.json'))
steps=rep.get('steps') or rep.get('total_steps')
tot=0
for f in glob.glob('/tmp/cg_$NAME.out*'):
    for line in open(f):
        if line.startswith('summary:') or line.startswith('totals:'):
            tot=max(tot,int(line.split()[1]))
print('$NAME', 'steps', steps, 'Ir', tot, 'Ir/step', tot/steps if steps else None)
PY
