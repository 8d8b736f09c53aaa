#include <stdio.h>

int vcudatest_value(void);
int main(void) {
    printf("%d\n", vcudatest_value());
    return 0;
}
