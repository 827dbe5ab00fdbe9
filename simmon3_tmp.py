import threading, time, sys, asyncio, collections
import testing.sim.world as w
worlds=[]
orig = w.World.__init__
def init(self,*a,**k):
    orig(self,*a,**k); worlds.append(self)
w.World.__init__=init
def mon():
    time.sleep(25)
    W=worlds[0]
    for i in W.ingestors:
        b=i.batcher
        now=b._monotonic()
        print(i.name, 'open', b._open and (b._open.opened_at-now, len(b._open.waiters)), 'sealed', len(b._sealed), 'inflight', b._inflight, 'next', b._next_deadline(now), 'closing', b._closing, 'last', b._last_start-now)
    import os; os._exit(0)
threading.Thread(target=mon, daemon=True).start()
w.run_seed(1)
