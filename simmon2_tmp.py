import threading, time, sys, asyncio, collections
import testing.sim.world as w
import testing.sim.loop as L
loops=[]
orig=L.VirtualTimeLoop.__init__
def init(self,*a,**k):
    orig(self,*a,**k); loops.append(self)
L.VirtualTimeLoop.__init__=init
def mon():
    time.sleep(25)
    lp=loops[0]
    c=collections.Counter()
    for i in range(200):
        for h in list(lp._ready):
            c[repr(h)[:160]]+=1
        for h in list(lp._scheduled)[:3]:
            c['S '+repr(h)[:160]+' when-now=%.9f'%(h._when-lp.time())]+=1
        time.sleep(0.01)
    for k,v in c.most_common(12): print(v,k)
    import os; os._exit(0)
threading.Thread(target=mon, daemon=True).start()
w.run_seed(1)
