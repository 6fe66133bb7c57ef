"""Plausible wrong solutions of chapter 08's implement-exercise (08.2, SIM's queue, events and clock:
`simulate`), each with the rule its grader must reject it by."""


def _simulate(eager=False, issued=True, waits=True, up_to_record=True, which="queued", host_max=True,
              in_order=True):
    """A simulate with one step of SIM's queue changed: `eager` runs work when it is queued; `issued=False`
    ignores the host time it was queued at; `waits=False` skips waits; `up_to_record=False` drains the other
    queue whole; `which="latest"` waits for the event's record last queued when the wait runs; `host_max=False`
    sets the host's time to the device's, even backwards; `in_order=False` lets a device overlap its items."""
    def simulate(calls):
        state = {"host": 0}
        queue, free, spans, records, times, owner = {}, {}, [], {}, {}, {}

        def execute(dev, item):
            kind, t_issued, arg = item
            start = max(free.get(dev, 0) if in_order else 0, t_issued if issued else 0)
            if kind == "wait" and waits:
                event, n = arg
                start = max(start, reach(event, records[event] if which == "latest" else n))
            elif kind == "record":
                times[arg] = start
            end = start + (arg[1] if kind == "work" else 0)
            free[dev] = max(free.get(dev, 0), end)
            if kind == "work":
                spans.append((dev, arg[0], start, end))

        def reach(event, n):
            dev = owner[event]
            while queue.get(dev) and (not up_to_record or (event, n) not in times):
                execute(dev, queue[dev].pop(0))
            return times.get((event, n), 0)

        def push(dev, item):
            queue.setdefault(dev, []).append(item)
            if eager:
                execute(dev, queue[dev].pop(0))

        def host_waits(t):
            state["host"] = max(state["host"], t) if host_max else t

        for kind, *args in calls:
            if kind == "work":
                push(args[0], ("work", state["host"], (args[1], args[2])))
            elif kind == "host":
                state["host"] += args[0]
            elif kind == "record":
                owner[args[1]] = args[0]
                records[args[1]] = records.get(args[1], 0) + 1
                push(args[0], ("record", state["host"], (args[1], records[args[1]])))
            elif kind == "wait":
                push(args[0], ("wait", state["host"], (args[1], records[args[1]])))
            elif kind == "sync":
                while queue.get(args[0]):
                    execute(args[0], queue[args[0]].pop(0))
                host_waits(free.get(args[0], 0))
            else:
                host_waits(reach(args[0], records[args[0]]))
        return spans, state["host"]
    return simulate


WRONG = {
    "08.2": [
        ("runs work as soon as it is queued", _simulate(eager=True), "lazy"),
        ("the host takes the device's time, even backwards", _simulate(host_max=False), "host waits"),
        ("items of one device overlap", _simulate(in_order=False), "in order"),
        ("ignores the host time an item was queued at", _simulate(issued=False), "issued"),
        ("skips waits", _simulate(waits=False), "wait"),
        ("a wait drains the other queue whole", _simulate(up_to_record=False), "up to the record"),
        ("waits for the event's latest record", _simulate(which="latest"), "which record"),
    ],
}
