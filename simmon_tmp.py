import threading, time, sys, faulthandler
import testing.sim.world as w
orig = w.World.__init__
worlds=[]
def init(self,*a,**k):
    orig(self,*a,**k); worlds.append(self)
w.World.__init__=init
def mon():
    while True:
        time.sleep(10)
        if worlds:
            W=worlds[0]
            print('MON t=', round(W.sim.now-w.START,2), 'acked', W.ledger.acked, 'req', W.ledger.requests, 'commits', W.checker.commits, 'notes', W.checker.notes[-2:], flush=True)
threading.Thread(target=mon, daemon=True).start()
faulthandler.dump_traceback_later(int(sys.argv[2]), exit=True)
t=time.time()
c=w.run_seed(int(sys.argv[1]), verbose='-v' in sys.argv)
print('violations', c.violations, c.summary(), round(time.time()-t,1))
print('\n'.join(c.notes))
