"""ForgetfulFirstFit: a deliberately broken plug-in — it forgets every freed block, so its bytes never
come back to the pool.

``allocsim.testing.check_policy(ForgetfulFirstFit)`` fails with "bytes not conserved".
"""
from first_fit import FirstFit


class ForgetfulFirstFit(FirstFit):
    name = "forgetful_first_fit"
    summary = "first fit that drops every freed block (broken on purpose)"

    def free(self, handle):
        pass
